-- #54: the team an event is about: its instance's team when the event was
-- written (the store fills it from the instance's row; NULL for events
-- about no instance). A team's events are read, and its webhooks fed, by it.
ALTER TABLE events ADD COLUMN team TEXT;
CREATE INDEX events_team ON events (team, id);
