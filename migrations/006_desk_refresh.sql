-- Deskmate schema, version 6: the day a memory last joined the desk (saved, edited, or recalled
-- from the drawer). With DESK_REFRESH=daily such a memory stays in the prompt's tail until the next
-- chat day, so the cached prompt head changes at most once a day (issue 5, BENCHMARKS.md).
-- NULL (memories older than this migration): not changed today, so they stay where they are.
ALTER TABLE memories ADD COLUMN desk_changed_on date;
