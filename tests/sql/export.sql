-- embkv_export(table, file) / embkv_import(table, file): every row with its
-- clock and optimizer state in a plain SQLite file (embkv_meta, embkv_rows),
-- and back into a table.  Statements expected to fail are alone on their
-- line (the shell skips the rest of a line after an error).
.headers off
.mode list
.nullvalue NULL
.bail off

-- 1. SGD round trip.  Rows written by INSERT, pulls and pushes, so the
--    clocks differ (lr 0.5, integer gradients: the vectors are exact).
CREATE VIRTUAL TABLE s1 USING embkv(dim=2, optimizer=sgd, lr=0.5, init=zeros);
INSERT INTO s1(id, vec) VALUES (1, '[1, 2]'), (2, '[3, 4]'), (-5, '[-1, -1]'), (9223372036854775807, '[7, 7]');
SELECT 'pull', length(embkv_pull('s1', '[10, 11]'));
SELECT 'push', embkv_push('s1', '[1, 10]', '[2, 2, 4, 4]'), embkv_push('s1', '[1, 2]', '[1, 1, 1, 1]'), embkv_push('s1', 1, '[2, 0]');
SELECT 's1', id, clock, embkv_json(vec) FROM s1 ORDER BY id;
SELECT 'export', embkv_export('s1', 's1.export');
-- the file: a plain SQLite database, readable without embkv's functions
ATTACH 's1.export' AS f;
SELECT 'meta', key, value FROM f.embkv_meta WHERE key NOT IN ('embkv_version') ORDER BY key;
SELECT 'file-row', id, clock, hex(vec), state IS NULL, typeof(crc) FROM f.embkv_rows ORDER BY id;
DETACH f;
-- into a fresh table of the same options: every row, vector and clock
CREATE VIRTUAL TABLE s2 USING embkv(dim=2, optimizer=sgd, lr=0.5, init=zeros);
SELECT 'import', embkv_import('s2', 's1.export');
SELECT 's2', id, clock, embkv_json(vec) FROM s2 ORDER BY id;
SELECT 'equal', count(*), sum(a.vec = b.vec AND a.clock = b.clock) FROM s1 a JOIN s2 b ON a.id = b.id;
-- clocks go on from where they were: a push after the import is one more
SELECT 'push-after', embkv_push('s2', 1, '[0, 0]'), (SELECT clock FROM s2 WHERE id = 1);
-- the other training options need not match (lr here)
CREATE VIRTUAL TABLE s3 USING embkv(dim=2, optimizer=sgd, lr=0.125);
SELECT 'import-other-lr', embkv_import('s3', 's1.export'), (SELECT count(*) FROM s3);

-- 2. Optimizer state: adagrad (dim floats of accumulator) and adam (2*dim+1).
--    A second export of the imported table is the same file row for row
--    (vec, state, clock and crc), and the same push on both tables gives
--    the same vectors (the state is what the update reads).
CREATE VIRTUAL TABLE a1 USING embkv(dim=3, optimizer=adagrad, lr=0.5, init='normal(0,0.1)', seed=3);
SELECT 'a1-pull', length(embkv_pull('a1', '[1, 2, 3, 4, 5]'));
SELECT 'a1-push', embkv_push('a1', '[1, 2, 3]', '[1, 2, 3, 4, 5, 6, 7, 8, 9]'), embkv_push('a1', '[1, 1, 5]', '[0.5, 0.5, 0.5, 1, 1, 1, -3, 2, 1]'), embkv_push('a1', 1, '[0.25, -1, 2]');
SELECT 'a1-export', embkv_export('a1', 'a1.export');
CREATE VIRTUAL TABLE a2 USING embkv(dim=3, optimizer=adagrad, lr=0.5);
SELECT 'a2-import', embkv_import('a2', 'a1.export');
SELECT 'a2-export', embkv_export('a2', 'a2.export');
ATTACH 'a1.export' AS x;
ATTACH 'a2.export' AS y;
SELECT 'a-files', count(*), sum(p.clock = q.clock AND p.vec = q.vec AND p.state = q.state AND p.crc = q.crc), sum(length(p.state)) FROM x.embkv_rows p JOIN y.embkv_rows q USING (id);
SELECT 'a-meta', group_concat(key || '=' || value, ' ') FROM (SELECT key, value FROM y.embkv_meta WHERE key IN ('dim', 'state_floats', 'optimizer', 'rows', 'table') ORDER BY key);
DETACH x;
DETACH y;
SELECT 'a-clocks', group_concat(id || ':' || clock, ' ') FROM (SELECT id, clock FROM a2 ORDER BY id);
SELECT 'a-same-push', embkv_push('a1', '[1, 2, 3, 4, 5]', '[1, -1, 2, 3, 0.5, 1, 1, 1, 1, 2, 2, 2, -1, 0, 1]'), embkv_push('a2', '[1, 2, 3, 4, 5]', '[1, -1, 2, 3, 0.5, 1, 1, 1, 1, 2, 2, 2, -1, 0, 1]');
SELECT 'a-after-push', count(*), sum(p.vec = q.vec AND p.clock = q.clock) FROM a1 p JOIN a2 q USING (id);
CREATE VIRTUAL TABLE m1 USING embkv(dim=2, optimizer=adam, lr=0.25, init='uniform(-1,1)', seed=9);
SELECT 'm1-push', embkv_push('m1', '[1, 2, 3]', '[1, 2, 3, 4, 5, 6]'), embkv_push('m1', '[1, 2]', '[-1, 1, 2, -2]'), embkv_push('m1', 1, '[0.5, 0.5]');
SELECT 'm1-export', embkv_export('m1', 'm1.export');
CREATE VIRTUAL TABLE m2 USING embkv(dim=2, optimizer=adam, lr=0.25);
SELECT 'm2-import', embkv_import('m2', 'm1.export');
SELECT 'm-clocks', group_concat(id || ':' || clock, ' ') FROM (SELECT id, clock FROM m2 ORDER BY id);
ATTACH 'm1.export' AS x;
SELECT 'm-state-bytes', group_concat(length(state), ' ') FROM x.embkv_rows;
DETACH x;
-- adam's bias correction uses each row's clock: equal vectors after the
-- same push only if clock and both moments came back exactly
SELECT 'm-same-push', embkv_push('m1', '[1, 2, 3]', '[1, 1, 1, 1, 1, 1]'), embkv_push('m2', '[1, 2, 3]', '[1, 1, 1, 1, 1, 1]');
SELECT 'm-after-push', count(*), sum(p.vec = q.vec AND p.clock = q.clock) FROM m1 p JOIN m2 q USING (id);

-- 3. Import into a table that has rows already: the file's rows replace
--    those of the same id (vector, state and clock), the others stay.
CREATE VIRTUAL TABLE r USING embkv(dim=2, optimizer=sgd, lr=0.5);
INSERT INTO r(id, vec) VALUES (1, '[100, 100]'), (3, '[300, 300]');
UPDATE r SET vec = '[101, 101]' WHERE id = 1;
UPDATE r SET vec = '[102, 102]' WHERE id = 1;
SELECT 'r-before', id, clock, embkv_json(vec) FROM r ORDER BY id;
SELECT 'r-import', embkv_import('r', 's1.export');
SELECT 'r-after', id, clock, embkv_json(vec) FROM r ORDER BY id;
-- importing twice is the same as once
SELECT 'r-again', embkv_import('r', 's1.export');
SELECT 'r-again', count(*), sum(clock) FROM r;

-- 4. An empty table exports an empty file, which imports nothing.
CREATE VIRTUAL TABLE e USING embkv(dim=2, optimizer=sgd);
SELECT 'empty-export', embkv_export('e', 'e.export');
ATTACH 'e.export' AS x;
SELECT 'empty-file', (SELECT count(*) FROM x.embkv_rows), (SELECT value FROM x.embkv_meta WHERE key = 'rows');
DETACH x;
CREATE VIRTUAL TABLE e2 USING embkv(dim=2, optimizer=sgd);
SELECT 'empty-import', embkv_import('e2', 'e.export'), (SELECT count(*) FROM e2);
-- a table whose rows were all deleted
DELETE FROM s3;
SELECT 'deleted-export', embkv_export('s3', 's3.export');

-- 5. Mismatches: dim, optimizer (and so state_floats).  Nothing imported.
CREATE VIRTUAL TABLE d4 USING embkv(dim=4, optimizer=sgd);
SELECT embkv_import('d4', 's1.export');
CREATE VIRTUAL TABLE ad USING embkv(dim=2, optimizer=adagrad);
SELECT embkv_import('ad', 's1.export');
CREATE VIRTUAL TABLE sg USING embkv(dim=3, optimizer=sgd);
SELECT embkv_import('sg', 'a1.export');
CREATE VIRTUAL TABLE am USING embkv(dim=3, optimizer=adam);
SELECT embkv_import('am', 'a1.export');
SELECT 'mismatch-left', (SELECT count(*) FROM d4), (SELECT count(*) FROM ad), (SELECT count(*) FROM sg), (SELECT count(*) FROM am);

-- 6. Files: missing, a directory, not SQLite (text, empty), SQLite but not
--    an export, an export of another format version, damaged ones.  The
--    target table stays as it was.
CREATE VIRTUAL TABLE t USING embkv(dim=2, optimizer=sgd, lr=0.5);
INSERT INTO t(id, vec) VALUES (42, '[4, 2]');
SELECT embkv_import('t', 'nosuch.export');
SELECT embkv_import('t', 'nodir/nosuch.export');
.shell mkdir adir
SELECT embkv_import('t', 'adir');
.shell printf 'id,vec\n1,"[1, 2]"\n' > text.csv
SELECT embkv_import('t', 'text.csv');
.shell : > empty.file
SELECT embkv_import('t', 'empty.file');
SELECT embkv_import('t', 'test.db');
ATTACH 'other.db' AS o;
CREATE TABLE o.embkv_meta(key TEXT PRIMARY KEY, value);
INSERT INTO o.embkv_meta VALUES ('format', 'something-else');
DETACH o;
SELECT embkv_import('t', 'other.db');
-- copies of s1.export changed through SQL (VACUUM INTO copies a database)
ATTACH 's1.export' AS src;
VACUUM src INTO 'v2.export';
VACUUM src INTO 'norows.export';
VACUUM src INTO 'count.export';
VACUUM src INTO 'crc.export';
VACUUM src INTO 'vecsize.export';
VACUUM src INTO 'state.export';
VACUUM src INTO 'clock.export';
VACUUM src INTO 'dimtext.export';
VACUUM src INTO 'nometa-dim.export';
DETACH src;
ATTACH 'v2.export' AS x;
UPDATE x.embkv_meta SET value = 2 WHERE key = 'format_version';
DETACH x;
SELECT embkv_import('t', 'v2.export');
ATTACH 'norows.export' AS x;
DROP TABLE x.embkv_rows;
DETACH x;
SELECT embkv_import('t', 'norows.export');
ATTACH 'count.export' AS x;
DELETE FROM x.embkv_rows WHERE id = 2;
DETACH x;
SELECT embkv_import('t', 'count.export');
ATTACH 'crc.export' AS x;
UPDATE x.embkv_rows SET vec = x'0000803f00008040' WHERE id = 2;
DETACH x;
SELECT embkv_import('t', 'crc.export');
ATTACH 'vecsize.export' AS x;
UPDATE x.embkv_rows SET vec = x'0000803f' WHERE id = 10;
DETACH x;
SELECT embkv_import('t', 'vecsize.export');
ATTACH 'state.export' AS x;
UPDATE x.embkv_rows SET state = x'00' WHERE id = 1;
DETACH x;
SELECT embkv_import('t', 'state.export');
ATTACH 'clock.export' AS x;
UPDATE x.embkv_rows SET clock = -1 WHERE id = 1;
DETACH x;
SELECT embkv_import('t', 'clock.export');
ATTACH 'dimtext.export' AS x;
UPDATE x.embkv_meta SET value = '2' WHERE key = 'dim';
DETACH x;
SELECT embkv_import('t', 'dimtext.export');
ATTACH 'nometa-dim.export' AS x;
DELETE FROM x.embkv_meta WHERE key = 'dim';
DETACH x;
SELECT embkv_import('t', 'nometa-dim.export');
-- a file cut short (the rows' pages gone): SQLite's own check says so
.shell head -c 2048 s1.export > cut.export
SELECT embkv_import('t', 'cut.export');
SELECT 't-unchanged', count(*), group_concat(id), embkv_json((SELECT vec FROM t WHERE id = 42)) FROM t;

-- 7. Export errors: an existing file (never overwritten), a directory that
--    does not exist; nothing left behind by a failed export.
SELECT embkv_export('t', 's1.export');
SELECT embkv_export('t', 'adir');
SELECT embkv_export('t', 'nodir/t.export');
SELECT embkv_export('t', 'test.db-journal');
SELECT 'still-s1', (SELECT count(*) FROM s2) = embkv_import('s2', 's1.export');
.shell set -- *embkv-tmp*; test -e "$1" && echo "temporary files left: $*" || echo "no temporary files left"

-- 8. Arguments: the table (TEXT naming an embkv table), the file (non-empty
--    TEXT), and no uncommitted writes of this connection to the table.
SELECT embkv_export(NULL, 'x.export');
SELECT embkv_export(1, 'x.export');
SELECT embkv_export('nosuch', 'x.export');
CREATE TABLE plain(x);
SELECT embkv_export('plain', 'x.export');
SELECT embkv_export('t', NULL);
SELECT embkv_export('t', 42);
SELECT embkv_export('t', x'00');
SELECT embkv_export('t', '');
SELECT embkv_import(NULL, 's1.export');
SELECT embkv_import(2.5, 's1.export');
SELECT embkv_import('nosuch', 's1.export');
SELECT embkv_import('plain', 's1.export');
SELECT embkv_import('t', NULL);
SELECT embkv_import('t', 7);
SELECT embkv_import('t', '');
SELECT embkv_export('t');
SELECT embkv_import('t', 's1.export', 1);
BEGIN;
INSERT INTO t(id, vec) VALUES (43, '[4, 3]');
SELECT embkv_export('t', 'pending.export');
SELECT embkv_import('t', 's1.export');
ROLLBACK;
SELECT 'qualified', embkv_export('main.t', 'qualified.export'), embkv_import('MAIN.T', 'qualified.export');
.shell for f in x.export pending.export; do test -e $f && echo "$f exists" || echo "$f absent"; done

-- 9. Direct-only: never from views or triggers.
CREATE VIEW ev AS SELECT embkv_export('t', 'view.export');
SELECT * FROM ev;
CREATE VIEW iv AS SELECT embkv_import('t', 's1.export');
SELECT * FROM iv;
CREATE TABLE log(n);
CREATE TRIGGER tr AFTER INSERT ON log BEGIN SELECT embkv_import('t', 's1.export'); END;
INSERT INTO log VALUES (1);
SELECT 'log rows', count(*) FROM log;

-- 10. Persistence: an import is checkpointed when it returns.
CREATE VIRTUAL TABLE p USING embkv(dim=3, optimizer=adagrad, lr=0.5, path='p.embkv');
SELECT 'p-import', embkv_import('p', 'a1.export');
-- @reopen
SELECT 'p-reopened', count(*), sum(clock) FROM p;
SELECT 'p-export', embkv_export('p', 'p.export');
ATTACH 'p.export' AS x;
ATTACH 'a1.export' AS y;
SELECT 'p-same', count(*), sum(q.clock = r.clock AND q.vec = r.vec AND q.state = r.state) FROM x.embkv_rows q JOIN y.embkv_rows r USING (id);

-- 11. Never into a store's directory or SSD tier, this table's or another's
--     (that store would refuse to open with a foreign file in it).
SELECT embkv_export('p', 'p.embkv/p.export');
SELECT embkv_export('p', 'p.embkv/log/p.export');
CREATE VIRTUAL TABLE other USING embkv(dim=3, path='other.embkv');
SELECT embkv_export('p', 'other.embkv/p.export');
SELECT 'still-opens', count(*) FROM other;

-- Some rows: embkv_export(table, file, ids) writes those of the ids the
-- table holds (a JSON array, an int64 BLOB or one integer; each once),
-- with state and clock, in the same format; an import puts just them.
SELECT 'some', embkv_export('a1', 'a1-some.export', '[3, 1, 99, 3]');
ATTACH 'a1-some.export' AS g;
SELECT 'some-rows', group_concat(id), (SELECT value FROM g.embkv_meta WHERE key = 'rows') FROM g.embkv_rows;
SELECT 'some-equal', count(*) FROM g.embkv_rows r JOIN a1 ON a1.id = r.id AND a1.vec = r.vec AND a1.clock = r.clock;
DETACH g;
SELECT 'one', embkv_export('a1', 'a1-one.export', 2);
CREATE VIRTUAL TABLE a9 USING embkv(dim=3, optimizer=adagrad, lr=0.5);
SELECT 'some-import', embkv_import('a9', 'a1-some.export'), embkv_import('a9', 'a1-one.export'), (SELECT group_concat(id) FROM (SELECT id FROM a9 ORDER BY id));
SELECT 'none-held', embkv_export('a1', 'a1-none.export', '[1000, 1001]');
SELECT embkv_export('a1', 'a1-bad.export', x'0102');
SELECT embkv_export('a1', 'a1-bad.export', '[]');
-- a file name is a path, taken literally by both: ':memory:' and 'file:'
-- names are files of the current directory, not SQLite's special names
SELECT 'literal-export', embkv_export('a1', ':memory:'), embkv_export('a1', 'file:a1.export?mode=rwc');
CREATE VIRTUAL TABLE a10 USING embkv(dim=3, optimizer=adagrad, lr=0.5);
SELECT 'literal-import', embkv_import('a10', ':memory:'), embkv_import('a10', 'file:a1.export?mode=rwc');
SELECT embkv_import('a10', 'file:nosuch.export');
