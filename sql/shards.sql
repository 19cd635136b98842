-- Analytics over a table sharded by embkv.distributed (docs/distributed.md):
-- each rank's shard is an embkv table in model_dir/rank-NNNNN.db.  Opened
-- read-only, the shards are read beside a job that is training (as of each
-- shard's last checkpoint) and nothing is changed.  From model_dir, for a
-- job of two ranks (one ATTACH per further rank):
--   sqlite3 -readonly -cmd '.load /path/to/build/embkv' rank-00000.db < shards.sql
.headers on
.mode column
ATTACH 'rank-00001.db' AS r1;
CREATE TEMP VIEW user_all AS
  SELECT 0 AS rank, id, vec, clock FROM main.user
  UNION ALL SELECT 1, id, vec, clock FROM r1.user;
-- rows, updates and mean norm per shard
SELECT rank, count(*) AS rows, sum(clock) AS updates, round(avg(embkv_norm(vec)), 4) AS mean_norm
FROM user_all GROUP BY rank ORDER BY rank;
-- every id lives in exactly one shard
SELECT count(*) AS rows, count(DISTINCT id) AS ids FROM user_all;
-- the most updated rows of the whole table
SELECT id, rank, clock FROM user_all ORDER BY clock DESC, id LIMIT 5;
