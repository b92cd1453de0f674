-- The tail of the Watch event log: one row per commit that changed
-- ownership, its events packed in `data` (see event_codec.rs). Rows older
-- than the log's length are deleted as new ones come.
CREATE TABLE events (
    first_revision INTEGER PRIMARY KEY NOT NULL,
    last_revision  INTEGER NOT NULL,
    data           BLOB NOT NULL
);
