-- Background hot-set migration from SQL (migrate='auto'): rows that
-- lookups by id make hot reach the cache without embkv_hotset; the rate
-- shows in embkv_stats; option errors name migrate or migrate_rate.
.headers off
.mode list
.nullvalue NULL
CREATE VIRTUAL TABLE item USING embkv(dim=4, path='item.store', cache_size='64K', migrate='auto', migrate_rate=100000);
INSERT INTO item(id, vec) SELECT value, json_array(value, 1, 2, 3) FROM generate_series(1, 3000);
SELECT 'tiers', tier, count(*) FROM item GROUP BY tier;
SELECT 'migration', json_extract(embkv_stats('item'), '$.migration.rate');
-- ten lookups of 30 ids (each a counted access), nothing else read by id
WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < 10)
SELECT 'lookups', count(*) FROM k, item WHERE item.id IN (SELECT value * 97 FROM generate_series(1, 30));
.shell sleep 2.5
SELECT 'hot in dram', count(*) FROM item WHERE id IN (SELECT value * 97 FROM generate_series(1, 30)) AND tier = 'dram';
SELECT 'rounds', json_extract(embkv_stats('item'), '$.migration.rounds') >= 1,
       json_extract(embkv_stats('item'), '$.migration.moved') >= 30,
       json_extract(embkv_stats('item'), '$.migration.errors');
SELECT 'values', id, embkv_json(vec) FROM item WHERE id IN (97, 2910) ORDER BY id;
SELECT 'count', count(*), sum(id) FROM item;
-- other tables on the same store: without a rate they share the running
-- migration, with one they set it
CREATE VIRTUAL TABLE item2 USING embkv(dim=4, path='item.store', migrate='auto');
SELECT 'shared', json_extract(embkv_stats('item2'), '$.migration.rate');
CREATE VIRTUAL TABLE item3 USING embkv(dim=4, path='item.store', migrate='auto', migrate_rate=2000);
SELECT 'set', json_extract(embkv_stats('item'), '$.migration.rate'), json_extract(embkv_stats('item2'), '$.migration.rate');
DROP TABLE item3;
DROP TABLE item2;
-- @reopen
-- the option is part of the table's declaration: a new process runs the
-- migration again (its counts start over), every row as before
.nullvalue NULL
SELECT 'reopened', count(*), sum(id), json_extract(embkv_stats('item'), '$.migration.rate') FROM item;
-- option errors
CREATE VIRTUAL TABLE bad1 USING embkv(dim=4, migrate='sometimes');
CREATE VIRTUAL TABLE bad2 USING embkv(dim=4, migrate_rate=1000);
CREATE VIRTUAL TABLE bad3 USING embkv(dim=4, migrate='auto', migrate_rate=0);
CREATE VIRTUAL TABLE bad4 USING embkv(dim=4, migrate='auto', migrate_rate='fast');
CREATE VIRTUAL TABLE ok1 USING embkv(dim=4, migrate='off');
CREATE VIRTUAL TABLE ok2 USING embkv(dim=4, migrate='AUTO');
SELECT 'defaults', json_extract(embkv_stats('ok1'), '$.migration'), json_extract(embkv_stats('ok2'), '$.migration.rate');
