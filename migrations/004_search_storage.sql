-- Deskmate schema, version 4: storage settings for the per-reply search (issue 5, BENCHMARKS.md).

-- A 512-dimension vector is 2,052 bytes, just over the 2 kB TOAST threshold, so by default every
-- vector was moved out of line and each scored memory cost three more buffer reads (TOAST index
-- and heap). MAIN keeps vectors in the row (random floats do not compress) and still moves a
-- vector out of line when a row would not fit in a page (e.g. 3,072-dimension models).
-- Vectors written before this migration stay out of line until they are written again.
ALTER TABLE memory_vectors ALTER COLUMN embedding SET STORAGE MAIN;

-- The first reply of a chat day updates the counters of the whole searchable set. Free space
-- in each page lets those updates stay on the page (HOT) without touching the four indexes of
-- the table: 74% HOT updates instead of 34% in the benchmark. Applies to pages written from now on.
ALTER TABLE memories SET (fillfactor = 85);
