-- The verified execution's start is an identity compared for equality with
-- the runtime's answer, which Docker gives to the nanosecond: kept in
-- microseconds it never matched, so every restarted daemon and every
-- upgrade's successor withdrew traffic from an unchanged container (R17).
-- Values recorded in microseconds become nanoseconds (they still will not
-- match a live execution exactly; each is verified once more, as before).
ALTER TABLE active_services RENAME COLUMN verified_started_at_us TO verified_started_at_ns;
-- A value no nanosecond count can hold (a row another tool wrote) is
-- dropped rather than overflowed: that execution is simply verified again.
UPDATE active_services SET verified_started_at_ns = CASE
        WHEN verified_started_at_ns BETWEEN -9000000000000000 AND 9000000000000000
        THEN verified_started_at_ns * 1000
        ELSE NULL
    END
    WHERE verified_started_at_ns IS NOT NULL;
