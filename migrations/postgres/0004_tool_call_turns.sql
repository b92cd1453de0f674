-- leasehold on PostgreSQL, schema version 4: turn-scoped tool calls (#15,
-- docs/lifecycle.md), with the same meaning as the SQLite backend's
-- migration 0005. A call may name a turn (models that reuse call ids in
-- every turn); its identity becomes (key, turn, call_id); '' is no turn.
-- Existing calls named none. Adding a column with a constant default
-- rewrites nothing; the primary key is rebuilt over the existing rows.

ALTER TABLE tool_calls ADD COLUMN turn text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_pkey;
ALTER TABLE tool_calls ADD PRIMARY KEY (key, turn, call_id);
-- A duplicate is looked for by id in every turn of the key (no turn named,
-- or across_turns), and a settle without a turn finds the calls of an id.
CREATE INDEX tool_calls_by_id ON tool_calls (key, call_id);
