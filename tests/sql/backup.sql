-- embkv_backup(table, dir): a copy of the last checkpoint as a new store,
-- opened as a table with path=dir.  Statements expected to fail are alone
-- on their line (the shell skips the rest of a line after an error).
.headers off
.mode list
.nullvalue NULL
.bail off

-- 1. Rows from INSERT, pulls and pushes (adagrad: the state matters), with
--    an SSD tier and a cache; a write since the last checkpoint included
--    (the backup checkpoints first).
CREATE VIRTUAL TABLE t USING embkv(dim=2, optimizer=adagrad, lr=0.5, init=zeros, path='t.store', cache_size='64K', ssd_size='64M');
INSERT INTO t(id, vec) VALUES (1, '[1, 2]'), (2, '[3, 4]'), (-7, '[-1, 0.5]');
SELECT 'pull', length(embkv_pull('t', '[10, 11, 1]'));
SELECT 'push', embkv_push('t', '[1, 10, 11]', '[1, 1, 2, 2, 4, 4]'), embkv_push('t', '[1, 2]', '[1, -1, 0.5, 0.5]');
SELECT 'backup', json_extract(b, '$.rows'), json_extract(b, '$.checkpoint') > 0, json_extract(b, '$.bytes') > 0, json_extract(b, '$.ms') >= 0
  FROM (SELECT embkv_backup('t', 'copy') AS b);
.shell ls copy | grep -v '^app-'
-- the copy opens as a table, row for row, and trains as the source did:
-- its options came with it (leave them out; another optimizer is refused)
CREATE VIRTUAL TABLE bad USING embkv(dim=2, optimizer=sgd, path='copy');
CREATE VIRTUAL TABLE c USING embkv(dim=2, path='copy');
SELECT 'c', id, clock, embkv_json(vec) FROM c ORDER BY id;
SELECT 'equal', count(*), sum(a.vec = b.vec AND a.clock = b.clock) FROM t a JOIN c b ON a.id = b.id;
-- the same push on both gives the same vectors: the optimizer state came along
SELECT 'same-push', embkv_push('t', '[1, 2]', '[1, 1, 1, 1]'), embkv_push('c', '[1, 2]', '[1, 1, 1, 1]');
SELECT 'equal-after', sum(a.vec = b.vec AND a.clock = b.clock) FROM t a JOIN c b ON a.id = b.id;
-- the copy is a store of its own: writes to one leave the other alone
DELETE FROM c WHERE id = -7;
SELECT 'apart', (SELECT count(*) FROM t), (SELECT count(*) FROM c);

-- 2. Refused, naming the table and the directory; nothing written.
SELECT embkv_backup('t', 'copy');
.shell mkdir other && touch other/notes.txt
SELECT embkv_backup('t', 'other');
SELECT embkv_backup('t', 't.store/inner');
SELECT embkv_backup('t', 'no/such/dir');
.shell touch afile
SELECT embkv_backup('t', 'afile');
SELECT embkv_backup('t', '');
SELECT embkv_backup('t', NULL);
SELECT embkv_backup('t', 3);
SELECT embkv_backup('t', 'cut' || char(0) || 'here');
SELECT embkv_backup('nosuch', 'x');
SELECT embkv_backup('t');
-- not under a name SQLite gives a file of the database (it would take the
-- copy for its journal, and the database would not open)
SELECT embkv_backup('t', 'test.db-journal');
SELECT embkv_backup('t', './test.db-wal');
SELECT embkv_backup('t', 'test.db-journal/');
SELECT embkv_backup('t', 'test.db-shm/.');
.shell ls
-- an empty directory is fine
.shell mkdir empty
SELECT 'into-empty', json_extract(embkv_backup('t', 'empty'), '$.rows');
-- uncommitted writes of this connection: COMMIT first
BEGIN;
INSERT INTO t(id, vec) VALUES (99, '[9, 9]');
SELECT embkv_backup('t', 'intx');
ROLLBACK;
-- not from views or triggers (it writes files)
CREATE VIEW v AS SELECT embkv_backup('t', 'fromview');
SELECT * FROM v;
