-- Tables of :memory: and temporary databases keep their store in a
-- temporary directory (under $TMPDIR: here tmp/), removed when the last
-- connection using it closes, or when its DROP commits.
.headers off
.mode list
.nullvalue NULL
.open :memory:
.load build/embkv
CREATE VIRTUAL TABLE m USING embkv(dim=2, pool_size='16M');
INSERT INTO m VALUES (1, '[1,2]'), (2, '[3,4]');
SELECT 'memory', id, embkv_json(vec) FROM m ORDER BY id;
SELECT 'path', json_extract(embkv_stats('m'), '$.path') GLOB '*/tmp/embkv-*';
.shell ls tmp | wc -l
CREATE VIRTUAL TABLE temp.t USING embkv(dim=2, pool_size='16M');
INSERT INTO temp.t VALUES (5, '[5,5]');
SELECT 'temp', id, embkv_json(vec) FROM temp.t;
SELECT 'temp-stats', json_extract(embkv_stats('temp.t'), '$.schema'), json_extract(embkv_stats('t'), '$.rows');
.shell ls tmp | wc -l
ATTACH ':memory:' AS aux;
CREATE VIRTUAL TABLE aux.a USING embkv(dim=2, pool_size='16M');
INSERT INTO aux.a VALUES (7, '[7,7]');
SELECT 'attached', id FROM aux.a;
.shell ls tmp | wc -l
-- A rollback that resets the schema reconnects the tables: same stores.
BEGIN;
CREATE TABLE x(a);
ROLLBACK;
SELECT 'after-schema-reset', count(*) FROM m;
-- DROP: the directory goes at COMMIT.
DROP TABLE m;
.shell ls tmp | wc -l
BEGIN;
DROP TABLE temp.t;
ROLLBACK;
SELECT 'temp-drop-rolled-back', count(*) FROM t;
.shell ls tmp | wc -l
BEGIN;
CREATE VIRTUAL TABLE m2 USING embkv(dim=2, pool_size='16M');
ROLLBACK;
.shell ls tmp | wc -l
CREATE VIRTUAL TABLE m3 USING embkv(dim=2, pool_size='16M');
INSERT INTO m3 VALUES (3, '[3,3]');
.shell ls tmp | wc -l
-- Closing the connection removes what is left.
.open test.db
.shell ls tmp | wc -l
.load build/embkv
-- A temporary table of a file database.
CREATE VIRTUAL TABLE temp.tt USING embkv(dim=2, pool_size='16M');
INSERT INTO tt VALUES (1, '[1,1]');
SELECT 'tt', count(*) FROM temp.tt;
.shell ls tmp | wc -l
.shell ls -d *.embkv 2>/dev/null | wc -l
-- @reopen
.shell ls tmp | wc -l
SELECT count(*) FROM tt;
