-- Webhook delivery (#42): per webhook, the id of the last event it was
-- sent or passed over. Delivery reads the event log after it and moves it
-- only once a receiver acknowledged, so a daemon killed mid-delivery sends
-- that event again (at least once). Keyed by the webhook's name in
-- stead.toml; a renamed webhook starts afresh.
CREATE TABLE webhook_cursors (
    webhook        TEXT   PRIMARY KEY CONSTRAINT webhook_cursors_name_nonempty CHECK (webhook <> ''),
    last_event_id  BIGINT NOT NULL,
    updated_at_us  BIGINT NOT NULL
);
