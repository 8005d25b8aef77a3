-- Public host names (#54): a host from the catalog's `domains` is reserved
-- for the instance whose publish first claimed it, until that instance is
-- deleted. One holder per host (the primary key); the row goes with its
-- instance's row (ON DELETE CASCADE, when a deleted instance's name is
-- reused), and a holder in state `deleted` no longer counts: the next
-- claim takes its host over (`Store::reserve_hosts`).
CREATE TABLE host_reservations (
    host           TEXT    NOT NULL CONSTRAINT host_reservations_pkey PRIMARY KEY
        CONSTRAINT host_reservations_host_check CHECK (host <> '' AND length(host) <= 253),
    instance_id    INTEGER NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    service        TEXT    NOT NULL CONSTRAINT host_reservations_service_check CHECK (service <> ''),
    created_at_us  INTEGER NOT NULL
);
CREATE INDEX host_reservations_instance ON host_reservations (instance_id);
