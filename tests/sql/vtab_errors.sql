-- Every error of the embkv virtual table: each names the table (and the
-- id, option or column at fault), says what was expected, and changes
-- nothing.
.headers off
.mode list
.nullvalue NULL
.shell mkdir other && touch other/foreign.txt && echo hi > notes.txt

-- Options.  (A value such as 16M must be quoted: SQLite's tokenizer
-- rejects it bare.)
CREATE VIRTUAL TABLE e USING embkv;
CREATE VIRTUAL TABLE e USING embkv(dims=4);
CREATE VIRTUAL TABLE e USING embkv(dim=0);
CREATE VIRTUAL TABLE e USING embkv(dim=8193);
CREATE VIRTUAL TABLE e USING embkv(dim=-1);
CREATE VIRTUAL TABLE e USING embkv(dim='four');
CREATE VIRTUAL TABLE e USING embkv(dim=4.5);
CREATE VIRTUAL TABLE e USING embkv(dim=4, DIM=4);
CREATE VIRTUAL TABLE e USING embkv(4);
CREATE VIRTUAL TABLE e USING embkv(dim=4, pool_size=1000);
CREATE VIRTUAL TABLE e USING embkv(dim=4, pool_size='12Q');
CREATE VIRTUAL TABLE e USING embkv(dim=4, pool_size=99999999999999999999999);
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity=0);
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity=);
-- exponent notation is read when it is a whole number
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity=1.5);
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity=2.55e1);
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity=1e13);
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity='1e');
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity='4.');
CREATE VIRTUAL TABLE e USING embkv(dim=4, capacity='.5e1');
CREATE VIRTUAL TABLE e USING embkv(dim=4, pool_size='32.M');
CREATE VIRTUAL TABLE temp.exp_frac USING embkv(dim=4, capacity=10.0, pool_size='1.7e7');
SELECT 'exponent-frac', json_extract(embkv_stats('exp_frac'), '$.index.buckets') > 0;
DROP TABLE exp_frac;
CREATE VIRTUAL TABLE temp.exp_ok USING embkv(dim=4, capacity=2.5e3, pool_size='1.7e7');
SELECT 'exponent', json_extract(embkv_stats('exp_ok'), '$.tiers.pm.capacity_bytes') > 16000000, json_extract(embkv_stats('exp_ok'), '$.index.buckets') >= 2500 / 14;
DROP TABLE exp_ok;
CREATE VIRTUAL TABLE e USING embkv(dim=4, path='');
CREATE VIRTUAL TABLE e USING embkv(dim=4, path='notes.txt');
CREATE VIRTUAL TABLE e USING embkv(dim=4, path='other');
CREATE VIRTUAL TABLE e USING embkv(dim=4, path='no/such/parent');
CREATE VIRTUAL TABLE e USING embkv(dim=4, path='mine', pool_size='16M');
CREATE VIRTUAL TABLE e2 USING embkv(dim=8, path='mine');
SELECT 'tables', group_concat(name, ' ') FROM (SELECT name FROM sqlite_schema ORDER BY name);
.shell ls

-- Vectors (dim 3: 12-byte BLOBs).
CREATE VIRTUAL TABLE v USING embkv(dim=3, pool_size='16M');
INSERT INTO v VALUES (10, '[1, 2, 3]');
INSERT INTO v VALUES (1, x'00');
INSERT INTO v VALUES (1, zeroblob(16));
INSERT INTO v VALUES (1, x'0000c07f0000000000000000');
INSERT INTO v VALUES (1, x'000000000000807f00000000');
INSERT INTO v VALUES (1, x'0000000000000000000080ff');
INSERT INTO v VALUES (1, '[1,2]');
INSERT INTO v VALUES (1, '[1,2,3,4]');
INSERT INTO v VALUES (1, '[]');
INSERT INTO v VALUES (1, '[1,"2",3]');
INSERT INTO v VALUES (1, '[1,null,3]');
INSERT INTO v VALUES (1, '[1,[2],3]');
INSERT INTO v VALUES (1, '[1,2,1e39]');
INSERT INTO v VALUES (1, '[1,2,-1e999]');
INSERT INTO v VALUES (1, '[1,2,NaN]');
INSERT INTO v VALUES (1, '[1,2,3] and more');
INSERT INTO v VALUES (1, '{"vec": [1,2,3]}');
INSERT INTO v VALUES (1, '1,2,3');
INSERT INTO v VALUES (1, '');
INSERT INTO v VALUES (1, NULL);
INSERT INTO v VALUES (1, 7);
INSERT INTO v VALUES (1, 7.5);
INSERT INTO v(id) VALUES (1);
UPDATE v SET vec = x'00' WHERE id = 10;
UPDATE v SET vec = NULL WHERE id = 10;
UPDATE v SET vec = '[1,2,3,4]', id = 11 WHERE id = 10;

-- Ids.
INSERT INTO v VALUES ('12a', '[1,2,3]');
INSERT INTO v VALUES (1.5, '[1,2,3]');
INSERT INTO v VALUES (NULL, '[1,2,3]');
INSERT INTO v(vec) VALUES ('[1,2,3]');
INSERT INTO v VALUES (x'01', '[1,2,3]');
INSERT INTO v VALUES ('99999999999999999999', '[1,2,3]');
INSERT INTO v VALUES (9.3e18, '[1,2,3]');
INSERT INTO v VALUES ('0x10', '[1,2,3]');
INSERT INTO v VALUES ('', '[1,2,3]');
INSERT INTO v(id, rowid, vec) VALUES (1, 2, '[1,2,3]');
UPDATE v SET id = NULL WHERE id = 10;
UPDATE v SET id = 'abc' WHERE id = 10;
UPDATE v SET id = 11, rowid = 12 WHERE id = 10;

-- Hidden columns are read-only (NULL on INSERT is accepted).
INSERT INTO v(id, vec, clock) VALUES (1, '[1,2,3]', 0);
INSERT INTO v(id, vec, tier) VALUES (1, '[1,2,3]', 'pm');
UPDATE v SET clock = clock + 1 WHERE id = 10;
UPDATE v SET tier = 'ssd';
INSERT INTO v(id, vec, clock, tier) VALUES (2, '[2,2,2]', NULL, NULL);

-- Conflicts, with and without a transaction around them.
INSERT INTO v VALUES (10, '[0,0,0]');
BEGIN;
INSERT INTO v VALUES (3, '[3,3,3]');
INSERT INTO v VALUES (3, '[0,0,0]');
COMMIT;
SELECT 'rows', id, embkv_json(vec), clock FROM v ORDER BY id;

-- The functions.
SELECT embkv_stats('nosuch');
SELECT embkv_stats('nosuch.v');
SELECT embkv_stats('temp.v');
CREATE TABLE plain(x);
SELECT embkv_stats('plain');
SELECT embkv_stats(NULL);
SELECT embkv_stats(42);
SELECT embkv_stats();
SELECT embkv_checkpoint('nosuch');
SELECT embkv_checkpoint(x'00');
SELECT 'ok', json_extract(embkv_stats('main.v'), '$.rows');

-- embkv_pending belongs to embkv.
INSERT INTO embkv_pending VALUES ('remove on commit', '/');
CREATE VIRTUAL TABLE p USING embkv_pending;

-- A COMMIT the pool cannot hold fails and writes nothing: 1000 rows of
-- 16 KiB do not fit in 16 MiB.
CREATE VIRTUAL TABLE big USING embkv(dim=4096, pool_size='16M', capacity=1000);
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
INSERT INTO big(id, vec) SELECT i, zeroblob(16384) FROM n;
SELECT 'in-txn', count(*) FROM big;
COMMIT;
SELECT 'after-full', count(*), json_extract(embkv_stats('big'), '$.rows') FROM big;
INSERT INTO big(id, vec) VALUES (1, zeroblob(16384));
SELECT 'usable', count(*) FROM big;

-- A table whose store is gone, or replaced by something else, cannot be
-- used, but can be dropped (its directory is left alone).
CREATE VIRTUAL TABLE gone USING embkv(dim=2, path='gone.embkv', pool_size='16M');
CREATE VIRTUAL TABLE foreign_ USING embkv(dim=2, path='foreign.embkv', pool_size='16M');
INSERT INTO gone VALUES (1, '[1,2]');
.open test.db
.shell rm -r gone.embkv foreign.embkv && mkdir foreign.embkv && touch foreign.embkv/x
.load build/embkv
SELECT * FROM gone;
INSERT INTO gone VALUES (2, '[2,2]');
BEGIN;
SAVEPOINT a;
INSERT INTO gone VALUES (3, '[3,3]');
ROLLBACK TO a;
RELEASE a;
COMMIT;
SELECT embkv_stats('gone');
SELECT id FROM foreign_;
DROP TABLE gone;
DROP TABLE foreign_;
SELECT 'dropped', count(*) FROM sqlite_schema WHERE name GLOB 'gone*' OR name GLOB 'foreign*';
.shell ls -d foreign.embkv/*
-- A table whose shadow table was dropped by hand can only be dropped too.
CREATE VIRTUAL TABLE noconf USING embkv(dim=2, path='noconf.embkv', pool_size='16M');
DROP TABLE noconf_config;
.open test.db
.load build/embkv
SELECT * FROM noconf;
DROP TABLE noconf;
SELECT 'dropped-noconf', count(*) FROM sqlite_schema WHERE name GLOB 'noconf*';
-- a full pool: a COMMIT that would not fit fails before writing anything
-- (its room is checked first), and deletes of committed rows, which need a
-- tombstone each until the next sync, still fit in small enough batches
CREATE VIRTUAL TABLE full USING embkv(dim=512, pool_size='16M', capacity=1);
CREATE TEMP TABLE seq(i INTEGER PRIMARY KEY);
WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < 499) INSERT INTO seq SELECT i FROM c;
INSERT INTO full SELECT i, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 500, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 1000, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 1500, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 2000, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 2500, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 3000, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 3500, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 4000, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 4500, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 5000, zeroblob(2048) FROM seq;
INSERT INTO full SELECT i + 5500, zeroblob(2048) FROM seq;
SELECT 'full-rows', count(*), max(id) FROM full;
DELETE FROM full;
SELECT 'full-rows', count(*) FROM full;
DELETE FROM full WHERE id < 100;
DELETE FROM full WHERE id < 200;
SELECT 'full-rows', count(*), min(id) FROM full;
SELECT 'full-check', json_extract(embkv_stats('full'), '$.rows');
-- a NUL byte inside JSON text is refused (cJSON alone would skip it), and an
-- out-of-range number is shown with the digits that make it so
CREATE VIRTUAL TABLE nul USING embkv(dim=3, pool_size='16M', seed=18446744073709551615);
INSERT INTO nul VALUES (1, '[1,2,' || char(0) || '3]');
INSERT INTO nul VALUES (2, '[1,2,3]' || char(0));
INSERT INTO nul VALUES (4, '[3.4028236e38,1,1]');
SELECT 'nul-rows', count(*) FROM nul;
CREATE VIRTUAL TABLE seedbig USING embkv(dim=3, pool_size='16M', seed=18446744073709551616);
-- One parser, one rule: trailing text, numbers not written as JSON,
-- hexadecimal options are refused; white space around an init is not.
CREATE VIRTUAL TABLE strict USING embkv(dim=2, init='normal(0, 1) ');
SELECT 'init-blank', embkv_dims(embkv_pull('strict', 1));
SELECT embkv_pull('strict', '[0] junk');
SELECT embkv_pull('strict', '[01]');
INSERT INTO strict(id, vec) VALUES (7, '[1.,0]');
INSERT INTO strict(id, vec) VALUES (7, '[01,0]');
INSERT INTO strict(id, vec) VALUES (7, '[-0.5e1, 2]');
SELECT 'json-ok', embkv_json(vec) FROM strict WHERE id = 7;
CREATE VIRTUAL TABLE hex USING embkv(dim=2, lr=0x10);
CREATE VIRTUAL TABLE strict2 USING embkv(dim=2, init='uniform(0x1, 2)');
-- dim and the optimizer together: Adam's state (2 * dim + 1 floats) must
-- fit a record, and the error says which dim does.
CREATE VIRTUAL TABLE adam8192 USING embkv(dim=8192, optimizer='adam');
CREATE VIRTUAL TABLE adam8191 USING embkv(dim=8191, optimizer='adam', pool_size='64M', capacity=100);
SELECT 'adam8191', count(*) FROM adam8191;
-- migrate_rate with migrate='off' given: says so.
CREATE VIRTUAL TABLE mig USING embkv(dim=2, migrate='off', migrate_rate=5);
-- durable: close or checkpoint only.
CREATE VIRTUAL TABLE dur USING embkv(dim=2, durable='sometimes');
CREATE VIRTUAL TABLE dur USING embkv(dim=2, durable=checkpoint);
SELECT count(*) FROM dur;
DROP TABLE dur;
-- A store's directory holds only its own files: no store and no SSD log
-- goes inside another store's (one there made it refuse to open), and the
-- outer store reopens untouched.  Its own log/ may be named.
CREATE VIRTUAL TABLE outer_t USING embkv(dim=2, path='outer.store');
INSERT INTO outer_t(id, vec) VALUES (1, '[1,2]');
CREATE VIRTUAL TABLE inner_t USING embkv(dim=2, path='outer.store/inner');
CREATE VIRTUAL TABLE logged USING embkv(dim=2, path='logged.store', ssd_size='8M', ssd_path='logged.store/seglog');
CREATE VIRTUAL TABLE logged2 USING embkv(dim=2, path='logged2.store', ssd_size='8M', ssd_path='outer.store/seglog');
CREATE VIRTUAL TABLE ownlog USING embkv(dim=2, path='ownlog.store', ssd_size='8M', ssd_path='ownlog.store/log');
INSERT INTO ownlog(id, vec) VALUES (2, '[3,4]');
.shell ls outer.store; ls -d logged.store logged2.store 2>&1 | sed 's/.*cannot access/cannot access/'
-- Nor inside a store's external SSD log (a directory holding segments),
-- whichever option names it.
.shell mkdir extlog && : > extlog/seg-0000000001.log
CREATE VIRTUAL TABLE in_log USING embkv(dim=2, path='extlog/inner');
CREATE VIRTUAL TABLE log_in_log USING embkv(dim=2, path='lil.store', ssd_size='8M', ssd_path='extlog/sub/log');
.shell ls extlog; ls -d lil.store 2>&1 | sed 's/.*cannot access/cannot access/'
-- @reopen
SELECT 'outer', id, embkv_json(vec) FROM outer_t;
SELECT 'ownlog', id, embkv_json(vec) FROM ownlog;
-- a message naming a long path is whole, its reason included
CREATE VIRTUAL TABLE longp USING embkv(dim=2, path='nosuch/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb/store');
-- a pool too small for the index its capacity asks: the message says what to give
CREATE VIRTUAL TABLE smallpool USING embkv(dim=2, pool_size='16M', capacity=1e6);
-- a table whose CREATE has a number an older build took ('400.', '.5e3'):
-- it still opens and drops; a new CREATE of it is refused
CREATE VIRTUAL TABLE oldnum USING embkv(dim=2, capacity=400, staleness=5);
INSERT INTO oldnum VALUES (1, '[1,2]');
PRAGMA writable_schema=ON;
UPDATE sqlite_schema SET sql = replace(replace(sql, 'capacity=400', 'capacity=400.'), 'staleness=5', 'staleness=.5e1') WHERE name = 'oldnum';
PRAGMA writable_schema=OFF;
-- @reopen
SELECT 'oldnum', id, embkv_json(vec) FROM oldnum;
SELECT 'oldnum-sql', sql LIKE '%capacity=400.,%staleness=.5e1%' FROM sqlite_schema WHERE name = 'oldnum';
DROP TABLE oldnum;
SELECT 'oldnum-dropped', count(*) FROM sqlite_schema WHERE name LIKE 'oldnum%';
CREATE VIRTUAL TABLE oldnum USING embkv(dim=2, capacity=400.);
-- a shadow table left without its table (the shell's .clone copies only
-- ordinary tables): the message says to drop it, which works
CREATE TABLE clone_config(k TEXT PRIMARY KEY, v) WITHOUT ROWID;
CREATE VIRTUAL TABLE clone USING embkv(dim=2);
DROP TABLE clone_config;
CREATE VIRTUAL TABLE clone USING embkv(dim=2);
SELECT 'clone', count(*) FROM clone;
