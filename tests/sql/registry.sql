-- What the extension registers, and with which safety flags.
-- (tests/python/test_fn_coverage.py checks that each of these has a test.)
.headers off
.mode list
.nullvalue NULL
.bail off

-- 1. Every embkv_* SQL function: kind (s scalar, w window/aggregate),
--    argument count, encoding and the flag bits of pragma_function_list:
--    SQLITE_DETERMINISTIC 0x800, SQLITE_DIRECTONLY 0x80000,
--    SQLITE_INNOCUOUS 0x200000.  Pure functions are deterministic and
--    innocuous; functions that touch a store (they name a table, and may
--    write) are direct-only and neither.
SELECT name, type, narg, enc,
       iif(flags & 0x800, 'deterministic', '-'),
       iif(flags & 0x200000, 'innocuous', '-'),
       iif(flags & 0x80000, 'directonly', '-')
FROM pragma_function_list WHERE name GLOB 'embkv_*' ORDER BY name, narg;

-- 2. The modules: embkv (the embedding table) and embkv_pending (an
--    eponymous table the binding uses to tie DROP TABLE to the transaction).
SELECT 'module', name FROM pragma_module_list WHERE name GLOB 'embkv*' ORDER BY name;

-- 3. Rules, whatever the list: no function is both innocuous and direct-only,
--    and every function is one or the other.  (Both queries print nothing.)
SELECT 'innocuous and directonly', name FROM pragma_function_list
WHERE name GLOB 'embkv_*' AND flags & 0x200000 AND flags & 0x80000;
SELECT 'neither innocuous nor directonly', name FROM pragma_function_list
WHERE name GLOB 'embkv_*' AND NOT flags & 0x200000 AND NOT flags & 0x80000;

-- 4. The flags at work.  With trusted_schema OFF, views may use innocuous
--    functions only; direct-only functions and the SQLITE_VTAB_DIRECTONLY
--    module are refused inside a view or trigger, whatever trusted_schema.
PRAGMA trusted_schema = OFF;
CREATE TABLE v(x);
INSERT INTO v VALUES ('[1,2]'), ('[3,4]');
CREATE VIEW pure AS
  SELECT embkv_dims(x) AS d, embkv_dot(x, x) AS dd, embkv_json(embkv_scale(x, 2)) AS s FROM v;
SELECT 'view', * FROM pure;
CREATE VIEW pure_agg AS SELECT embkv_json(embkv_sum(x)) AS s, embkv_json(embkv_avg(x)) AS a FROM v;
SELECT 'view-agg', * FROM pure_agg;
CREATE VIEW info AS SELECT embkv_version() AS version, embkv_build() IS NOT NULL AS build;
SELECT 'view-info', * FROM info;
CREATE VIRTUAL TABLE item USING embkv(dim=2, path='item.embkv');
INSERT INTO item(id, vec) VALUES (1, '[1,2]');
SELECT 'direct', count(*) FROM item;
CREATE VIEW via_view AS SELECT count(*) FROM item;
SELECT * FROM via_view;
CREATE VIEW stats_view AS SELECT embkv_stats('item');
SELECT * FROM stats_view;
CREATE VIEW checkpoint_view AS SELECT embkv_checkpoint('item');
SELECT * FROM checkpoint_view;
CREATE TABLE log(n);
CREATE TRIGGER t AFTER INSERT ON log BEGIN SELECT embkv_checkpoint('item'); END;
INSERT INTO log VALUES (1);
SELECT 'log rows', count(*) FROM log;
-- the same calls at top level are allowed
SELECT 'top-level', json_valid(embkv_stats('item')), embkv_checkpoint('item') > 0;
