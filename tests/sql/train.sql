-- Training through SQL: embkv_pull / embkv_push / embkv_release and the
-- table's training options (optimizer, lr, initial_accumulator, eps, beta1,
-- beta2, init, seed, staleness, wait_ms).
-- Numbers are chosen so that every optimizer step is exact in float32
-- (lr 0.5, gradients 1, 2, ...; adagrad's and adam's first step is lr*g/|g|),
-- so the printed vectors are what the arithmetic says, not pasted output.
-- Statements expected to fail are alone on their line (the shell skips the
-- rest of a line after an error).
.headers off
.mode list
.nullvalue NULL
.bail off

-- 1. Options.  Every training option accepted (names and values are
--    case-insensitive where they are words); a table with all of them works.
CREATE VIRTUAL TABLE opt_all USING embkv(dim=2, optimizer='Adam', lr=0.25, initial_accumulator=0.5, eps=1, beta1=0.5, beta2=0.75, init='Uniform( -1 , 1 )', seed=42, staleness=3, wait_ms=100);
CREATE VIRTUAL TABLE opt_sgd USING embkv(dim=2, optimizer=sgd, init=zeros, staleness=unlimited, wait_ms=0, seed=0);
CREATE VIRTUAL TABLE opt_ada USING embkv(dim=2, optimizer=adagrad, lr=1, initial_accumulator=3, eps=1e-30, init='normal(0,0)');
CREATE VIRTUAL TABLE opt_none USING embkv(dim=2, init=none, staleness=0);
SELECT 'created', group_concat(name, ' ') FROM (SELECT name FROM sqlite_schema WHERE name GLOB 'opt_*' AND name NOT GLOB '*_config' ORDER BY name);
-- adam's state (2*dim+1 floats) and adagrad's (dim) are kept with the row
SELECT 'state_floats', json_extract(embkv_stats('opt_all'), '$.state_floats'), json_extract(embkv_stats('opt_sgd'), '$.state_floats'), json_extract(embkv_stats('opt_ada'), '$.state_floats');
-- The options at work.  opt_all: adam, lr 0.25, eps 1, betas 0.5/0.75; the
-- first adam step is w - lr*g/(|g|+eps) whatever the betas: g=1 -> 0.125,
-- g=3 -> 0.1875.  Its init is uniform(-1,1): pull, push, pull again and
-- compare the difference (in double, within float32 rounding).
CREATE TABLE keep(k TEXT PRIMARY KEY, b);
INSERT INTO keep VALUES ('opt_all-before', embkv_pull('opt_all', 1));
SELECT 'adam-eps1-push', embkv_push('opt_all', 1, '[1, 3]');
SELECT 'adam-eps1', abs(json_extract(d, '$[0]') + 0.125) < 1e-6, abs(json_extract(d, '$[1]') + 0.1875) < 1e-6
  FROM (SELECT embkv_json(embkv_sub(embkv_pull('opt_all', 1), (SELECT b FROM keep WHERE k = 'opt_all-before'))) AS d);
-- opt_ada: adagrad, lr 1, initial accumulator 3, eps ~0, init normal(0,0)
-- (all zeros): g=1: acc = 3 + 1 = 4, w = 0 - 1*1/sqrt(4) = -0.5; g=-1: +0.5.
SELECT 'adagrad-acc0', embkv_push('opt_ada', 7, '[1, -1]');
SELECT 'adagrad-acc0', embkv_json(embkv_pull('opt_ada', 7));
-- opt_sgd: the default lr 0.01: 0.01*100 = 1, 0.01*-50 = -0.5
SELECT 'sgd-default-lr', embkv_push('opt_sgd', 1, '[100, -50]');
SELECT 'sgd-default-lr', embkv_json(embkv_pull('opt_sgd', 1));
-- opt_all's staleness 3 and wait_ms 100: it holds one pull of id 1 (the
-- one after its push); three more pass, a fifth waits 100 ms and fails
SELECT 'staleness3', length(embkv_pull('opt_all', 1)), length(embkv_pull('opt_all', 1)), length(embkv_pull('opt_all', 1));
SELECT embkv_pull('opt_all', 1);
-- Bad values: an error naming the option, and no table left behind.
CREATE VIRTUAL TABLE bad USING embkv(dim=2, optimizer=rmsprop);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, lr=0);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, lr=-0.5);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, init='uniform(1,0)');
CREATE VIRTUAL TABLE bad USING embkv(dim=2, init='uniform(1,1)');
CREATE VIRTUAL TABLE bad USING embkv(dim=2, init='normal(0,-1)');
CREATE VIRTUAL TABLE bad USING embkv(dim=2, init='normal(0)');
CREATE VIRTUAL TABLE bad USING embkv(dim=2, init=ones);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, staleness=-1);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, staleness=1.5);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, beta1=1);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, beta2=-0.1);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, eps=0);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, initial_accumulator=-1);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, seed=-1);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, wait_ms=soon);
CREATE VIRTUAL TABLE bad USING embkv(dim=2, lr=0.1, lr=0.2);
SELECT 'bad-left', count(*) FROM sqlite_schema WHERE name GLOB 'bad*';

-- 2. Pull: ids as an int64 little-endian BLOB, a JSON array or one integer;
--    the result is len(ids)*dim float32 in the order of the ids.
CREATE VIRTUAL TABLE item USING embkv(dim=2, lr=0.5);
INSERT INTO item(id, vec) VALUES (1, '[1, 2]'), (2, '[3, 4]'), (-1, '[-1, -1]'), (9223372036854775807, '[7, 7]');
SELECT 'blob', hex(embkv_pull('item', x'0100000000000000')), hex(embkv_pull('item', x'02000000000000000100000000000000'));
SELECT 'blob-extreme', embkv_json(embkv_pull('item', x'ffffffffffffffffffffffffffffff7f'));
SELECT 'json', embkv_json(embkv_pull('item', '[2, 1, -1]')), embkv_json(embkv_pull('item', ' [ 1 ] '));
SELECT 'int', embkv_json(embkv_pull('item', 2)), embkv_json(embkv_pull('item', -1)), embkv_json(embkv_pull('item', 9223372036854775807));
SELECT 'forms-agree', embkv_pull('item', '[1,2]') = embkv_pull('item', x'01000000000000000200000000000000'), embkv_pull('item', 1) = embkv_pull('item', '[1]');
SELECT 'length', length(embkv_pull('item', '[1,2,1,2,1]')), typeof(embkv_pull('item', 1));
-- duplicates: each position gets its vector
SELECT 'dups', embkv_json(embkv_pull('item', '[1, 1, 2, 1]'));
-- bad ids and table arguments
SELECT embkv_pull('item', x'01000000000000');
SELECT embkv_pull('item', x'');
SELECT embkv_pull('item', '[]');
SELECT embkv_pull('item', '[1, 2.5]');
SELECT embkv_pull('item', '[1, "2"]');
SELECT embkv_pull('item', '[9007199254740993]');
SELECT embkv_pull('item', '[-1e19]');
SELECT embkv_pull('item', '7');
SELECT embkv_pull('item', 'not json');
SELECT embkv_pull('item', 1.0);
SELECT embkv_pull('item', NULL);
SELECT embkv_pull('nosuch', 1);
SELECT embkv_pull(NULL, 1);
CREATE TABLE plain(x);
SELECT embkv_pull('plain', 1);
SELECT 'qualified', embkv_json(embkv_pull('main.item', 1)), embkv_json(embkv_pull('ITEM', 2));
-- init none (the default): a missing id is an error naming it, and nothing
-- is created, not even the ids before it.
SELECT embkv_pull('item', '[1, 424242, 2]');
SELECT embkv_pull('item', 5);
SELECT 'none-created', count(*) FROM item;
SELECT embkv_push('item', '[1, 55]', '[1, 1, 1, 1]');
SELECT 'none-push-unchanged', count(*), embkv_json((SELECT vec FROM item WHERE id = 1)), (SELECT clock FROM item WHERE id = 1) FROM item;
-- pulls read, they never write: the clock stays 0
SELECT 'pull-clock', group_concat(clock) FROM (SELECT clock FROM item ORDER BY id);

-- 3. Deferred initialization, deterministic with a seed.
CREATE VIRTUAL TABLE z USING embkv(dim=3, init=zeros, seed=5);
SELECT 'zeros', hex(embkv_pull('z', '[10, 11]')), (SELECT count(*) FROM z), (SELECT group_concat(clock) FROM z);
-- two tables with the same seed give the same values for the same ids, in
-- any order of calls; another seed gives other values.
CREATE VIRTUAL TABLE u1 USING embkv(dim=4, init='uniform(-0.5,0.5)', seed=7);
CREATE VIRTUAL TABLE u2 USING embkv(dim=4, init='uniform(-0.5,0.5)', seed=7);
CREATE VIRTUAL TABLE u3 USING embkv(dim=4, init='uniform(-0.5,0.5)', seed=8);
CREATE TABLE pulled(tab, b);
INSERT INTO pulled VALUES ('u1', embkv_pull('u1', '[3, 2, 1]'));
INSERT INTO pulled VALUES ('u2-1', embkv_pull('u2', 1)), ('u2-2', embkv_pull('u2', 2)), ('u2-3', embkv_pull('u2', 3));
INSERT INTO pulled VALUES ('u3', embkv_pull('u3', '[3, 2, 1]'));
-- (|| makes TEXT of BLOBs: compare the hex)
SELECT 'same-seed', hex((SELECT b FROM pulled WHERE tab = 'u1')) = hex((SELECT b FROM pulled WHERE tab = 'u2-3')) || hex((SELECT b FROM pulled WHERE tab = 'u2-2')) || hex((SELECT b FROM pulled WHERE tab = 'u2-1'));
SELECT 'other-seed', (SELECT b FROM pulled WHERE tab = 'u1') = (SELECT b FROM pulled WHERE tab = 'u3');
SELECT 'ids-differ', substr(b, 1, 16) <> substr(b, 17, 16), substr(b, 17, 16) <> substr(b, 33, 16) FROM pulled WHERE tab = 'u1';
SELECT 'elements-differ', count(DISTINCT value) FROM json_each((SELECT embkv_json(b) FROM pulled WHERE tab = 'u1'));
SELECT 'in-range', count(*), min(value) >= -0.5, max(value) < 0.5 FROM pulled, json_each(embkv_json(pulled.b)) WHERE tab IN ('u1', 'u3');
-- a second pull returns the stored row, not a new draw
SELECT 'stable', embkv_pull('u1', '[3, 2, 1]') = (SELECT b FROM pulled WHERE tab = 'u1');
SELECT 'created', json_extract(embkv_stats('u1'), '$.training.rows_created'), (SELECT count(*) FROM u1);
-- the values themselves (checked above: same seed same values, in range)
SELECT 'u1-values', id, embkv_json(vec) FROM u1 ORDER BY id;
-- a row created by a push starts from the same initial values: a zero
-- gradient leaves them as they are
SELECT 'push-creates', embkv_push('u2', 50, '[0, 0, 0, 0]');
SELECT 'push-creates', (SELECT vec FROM u2 WHERE id = 50) = embkv_pull('u1', 50), (SELECT clock FROM u2 WHERE id = 50);
-- uniform over many values: inside [a, b), spread over it
CREATE VIRTUAL TABLE uw USING embkv(dim=8, init='uniform(-0.25,0.75)', seed=3);
SELECT 'uniform-many', count(*), min(value) >= -0.25, max(value) < 0.75, min(value) < -0.2, max(value) > 0.7, abs(avg(value) - 0.25) < 0.03
  FROM json_each((SELECT embkv_json(embkv_pull('uw', (SELECT json_group_array(value) FROM generate_series(1, 200))))));
-- normal(2, 0.5): sample mean and standard deviation close to 2 and 0.5;
-- normal(m, 0) is m exactly
CREATE VIRTUAL TABLE nw USING embkv(dim=8, init='normal(2,0.5)', seed=11);
SELECT 'normal-many', count(*), abs(avg(value) - 2) < 0.05, abs(sqrt(avg(value * value) - avg(value) * avg(value)) - 0.5) < 0.05
  FROM json_each((SELECT embkv_json(embkv_pull('nw', (SELECT json_group_array(value) FROM generate_series(1, 200))))));
CREATE VIRTUAL TABLE n0 USING embkv(dim=3, init='normal(1.5,0)', seed=11);
SELECT 'normal-std0', embkv_json(embkv_pull('n0', '[1, 2]'));
CREATE TABLE saved(tab, b);
INSERT INTO saved SELECT 'u1', embkv_pull('u1', '[1, 2, 3, 50]');

-- 4. SGD: w -= lr * g, lr 0.5 (option) or the 4th argument.
CREATE VIRTUAL TABLE sgd USING embkv(dim=2, optimizer=sgd, lr=0.5, init=zeros);
SELECT 'sgd-push', embkv_push('sgd', '[1, 2]', '[1, 2, -2, 4]');
SELECT 'sgd', id, embkv_json(vec), clock FROM sgd ORDER BY id;
-- duplicates: gradients summed, one update, one clock step; returns the
-- number of distinct rows
SELECT 'sgd-dups', embkv_push('sgd', '[1, 1, 2, 1]', '[1, 0, 0, 1, 0.5, 0.5, 1, 1]');
SELECT 'sgd', id, embkv_json(vec), clock FROM sgd ORDER BY id;
-- ids and grads as BLOBs (id 1, grads [1, -1] as float32 little-endian)
SELECT 'sgd-blob', embkv_push('sgd', x'0100000000000000', x'0000803f000080bf');
SELECT 'sgd', id, embkv_json(vec), clock FROM sgd WHERE id = 1;
-- the lr argument overrides the table's for that call only
SELECT 'sgd-lr', embkv_push('sgd', 2, '[1, 1]', 0.25), embkv_push('sgd', 2, '[1, 1]', 2), embkv_push('sgd', 2, '[1, 1]', NULL);
SELECT 'sgd', id, embkv_json(vec), clock FROM sgd WHERE id = 2;
-- Errors change nothing: wrong sizes, NaN/Inf, non-numbers, a bad lr.
SELECT embkv_push('sgd', 1, x'0000803f');
SELECT embkv_push('sgd', '[1, 2]', '[1, 1]');
SELECT embkv_push('sgd', 1, '[1, 1, 1]');
SELECT embkv_push('sgd', 1, x'0000803f0000c07f');
SELECT embkv_push('sgd', '[1, 2]', x'0000803f0000803f0000807f00000000');
SELECT embkv_push('sgd', '[2, 1]', x'000080ff0000803f0000803f0000803f');
SELECT embkv_push('sgd', 1, '[1, "x"]');
SELECT embkv_push('sgd', 1, '[1, null]');
SELECT embkv_push('sgd', 1, 'oops');
SELECT embkv_push('sgd', 1, 3);
SELECT embkv_push('sgd', 1, '[1, 1]', 0);
SELECT embkv_push('sgd', 1, '[1, 1]', -1);
SELECT embkv_push('sgd', 1, '[1, 1]', '0.5');
SELECT embkv_push('sgd', 1, '[1, 1]', 1e999);
SELECT embkv_push('sgd', '[]', '[]');
SELECT 'sgd-after-errors', id, embkv_json(vec), clock FROM sgd ORDER BY id;
SELECT 'sgd-stats', json_extract(embkv_stats('sgd'), '$.training');

-- 5. Adagrad (PyTorch's rule): acc += g*g; w -= lr*g/(sqrt(acc)+eps).
--    eps default 1e-10: the first step is lr*g/|g| to within float32.
CREATE VIRTUAL TABLE ada USING embkv(dim=2, optimizer=adagrad, lr=0.5, init=zeros);
SELECT 'ada-push', embkv_push('ada', 1, '[3, -0.25]');
SELECT 'ada', id, embkv_json(vec), clock FROM ada WHERE id = 1;
-- second step: acc = 9+16 = 25, w = -0.5 - 0.5*4/5; acc = 0.0625+0.0625,
-- w = 0.5 - 0.5*(-0.25)/sqrt(0.125)  (compared in double, within float32)
SELECT 'ada-push2', embkv_push('ada', 1, '[4, -0.25]');
SELECT 'ada-step2', abs(json_extract(j, '$[0]') - (-0.5 - 0.5 * 4 / 5.0)) < 1e-6, abs(json_extract(j, '$[1]') - (0.5 + 0.5 * 0.25 / sqrt(0.125))) < 1e-6
  FROM (SELECT embkv_json(vec) AS j FROM ada WHERE id = 1);
-- duplicates are summed before the update: 1.5 + 1.5 = 3, acc 9, step lr*1.
-- (Applied one after the other they would give 0.5 + 0.5*1.5/sqrt(4.5).)
SELECT 'ada-dups', embkv_push('ada', '[2, 2]', '[1.5, -2, 1.5, -2]');
SELECT 'ada', id, embkv_json(vec), clock FROM ada WHERE id = 2;
-- eps at work: eps=1, g=1 -> w -= lr*1/(1+1)
CREATE VIRTUAL TABLE ada_eps USING embkv(dim=2, optimizer=adagrad, lr=0.5, eps=1, init=zeros);
SELECT 'ada-eps', embkv_push('ada_eps', 1, '[1, 3]');
SELECT 'ada-eps', embkv_json(embkv_pull('ada_eps', 1));

-- 6. Adam (PyTorch's rule, eps 1e-8): the first step is lr*g/|g|; the
--    second with the same gradient again about lr*g/|g|.
CREATE VIRTUAL TABLE adam USING embkv(dim=2, optimizer=adam, lr=0.5, init=zeros);
SELECT 'adam-push', embkv_push('adam', 1, '[2, -0.5]');
SELECT 'adam', id, embkv_json(vec), clock FROM adam WHERE id = 1;
SELECT 'adam-push2', embkv_push('adam', 1, '[2, -0.5]');
SELECT 'adam-step2', abs(json_extract(j, '$[0]') + 1) < 1e-6, abs(json_extract(j, '$[1]') - 1) < 1e-6, clock
  FROM (SELECT embkv_json(vec) AS j, clock FROM adam WHERE id = 1);

-- 7. Staleness.  staleness=0, wait_ms=100: one pull of an id per push.
CREATE VIRTUAL TABLE s0 USING embkv(dim=2, optimizer=sgd, lr=1, init=zeros, staleness=0, wait_ms=100);
SELECT 's0-pull', hex(embkv_pull('s0', 1));
SELECT embkv_pull('s0', 1);
-- a plain SELECT is a snapshot read: no permit, no wait
SELECT 's0-select', embkv_json(vec) FROM s0 WHERE id = 1;
-- other ids are free; duplicates in one pull take one permit
SELECT 's0-other', hex(embkv_pull('s0', '[2, 2, 2]'));
-- a pull that fails holds nothing it took in that call: 3 stays free
SELECT embkv_pull('s0', '[3, 1]');
SELECT 's0-free', hex(embkv_pull('s0', 3));
-- embkv_release returns permits without an update
SELECT 's0-release', embkv_release('s0', '[1, 3]');
SELECT 's0-after-release', hex(embkv_pull('s0', 1)), (SELECT clock FROM s0 WHERE id = 1);
-- a push returns the permit: the next pull sees the update
SELECT 's0-push', embkv_push('s0', 1, '[-1, -2]');
SELECT 's0-after-push', embkv_json(embkv_pull('s0', 1));
SELECT embkv_pull('s0', 1);
SELECT 's0-push', embkv_push('s0', '[1, 2]', '[-1, -1, -1, -1]');
SELECT 's0-after-push', embkv_json(embkv_pull('s0', '[1, 2]'));
SELECT 's0-release', embkv_release('s0', '[1, 2]');
-- every pull, push and timeout counted: pulls are ids pulled (duplicates
-- included), pushes distinct rows, waits pulls that had to wait
SELECT 's0-stats', json_extract(embkv_stats('s0'), '$.training');
-- a failed pull of a missing id (no initializer) returns its permit
CREATE VIRTUAL TABLE s0n USING embkv(dim=2, staleness=0, wait_ms=100);
SELECT embkv_pull('s0n', 8);
INSERT INTO s0n(id, vec) VALUES (8, '[8, 8]');
SELECT 's0n', embkv_json(embkv_pull('s0n', 8));
-- 'once' (argument 3): ids this connection holds a permit on take no
-- other (a step reading a row twice holds one permit); the others wait as
-- in any pull; one push of the step with its duplicates: one update a row
CREATE VIRTUAL TABLE s0o USING embkv(dim=2, optimizer=sgd, lr=1, init=zeros, staleness=0, wait_ms=100);
SELECT 's0o', length(embkv_pull('s0o', '[1, 2]')), length(embkv_pull('s0o', '[2, 1, 3, 3]', 'once')), length(embkv_pull('s0o', 1, 'ONCE'));
SELECT embkv_pull('s0o', 3);
SELECT 's0o-push', embkv_push('s0o', '[1, 2, 1, 3]', '[1, 1, 1, 1, 1, 1, 1, 1]');
SELECT 's0o-after', embkv_json(embkv_pull('s0o', '[1, 2, 3]')), (SELECT group_concat(clock) FROM s0o);
SELECT 's0o-release', embkv_release('s0o', '[1, 2, 3]');
SELECT embkv_pull('s0o', 1, 'twice');
SELECT embkv_pull('s0o', 1, 1);
SELECT embkv_pull('s0o', 1, x'6f6e6365');
SELECT embkv_pull('s0o', 1, CAST(x'6f6e63650078' AS TEXT));
SELECT 's0o-null', length(embkv_pull('s0o', 1, NULL)), embkv_release('s0o', 1);
-- staleness=2: three pulls of an id pass, the fourth waits and fails
CREATE VIRTUAL TABLE s2 USING embkv(dim=2, init=zeros, staleness=2, wait_ms=100);
SELECT 's2', length(embkv_pull('s2', 4)), length(embkv_pull('s2', 4)), length(embkv_pull('s2', 4));
SELECT embkv_pull('s2', 4);
SELECT 's2-push', embkv_push('s2', 4, '[0, 0]');
SELECT 's2-after-push', length(embkv_pull('s2', 4));
SELECT embkv_pull('s2', 4);
SELECT 's2-stats', json_extract(embkv_stats('s2'), '$.training');
-- wait_ms=0: no wait at all
CREATE VIRTUAL TABLE sw0 USING embkv(dim=2, init=zeros, staleness=0, wait_ms=0);
SELECT 'sw0', length(embkv_pull('sw0', 1));
SELECT embkv_pull('sw0', 1);
-- unlimited (the default): no permits
SELECT 'unlimited', length(embkv_pull('z', '[10, 10]')), length(embkv_pull('z', 10)), length(embkv_pull('z', 10));

-- 8. Training writes and SQL transactions.  A connection with uncommitted
--    SQL writes to a table cannot pull or push it; it can release (0 here:
--    it holds no permit), which changes no row; other tables are not
--    affected; after COMMIT it can.
BEGIN;
INSERT INTO sgd(id, vec) VALUES (9, '[9, 9]');
SELECT embkv_pull('sgd', 1);
SELECT embkv_push('sgd', 1, '[1, 1]');
SELECT embkv_release('sgd', 1);
SELECT 'txn-other-table', embkv_json(embkv_pull('z', 10));
COMMIT;
SELECT 'txn-after-commit', embkv_json(embkv_pull('sgd', '[1, 9]'));
-- a push is not part of the SQL transaction: ROLLBACK does not undo it
BEGIN;
SELECT 'txn-push', embkv_push('sgd', 9, '[2, 2]');
ROLLBACK;
SELECT 'txn-after-rollback', embkv_json(vec), clock FROM sgd WHERE id = 9;
-- after a ROLLBACK of SQL writes the table is usable again
BEGIN;
DELETE FROM sgd WHERE id = 9;
SELECT embkv_pull('sgd', 9);
ROLLBACK;
SELECT 'txn-after-rollback2', embkv_json(embkv_pull('sgd', 9));

-- 9. Direct-only: never from a view or a trigger (whatever trusted_schema).
PRAGMA trusted_schema = OFF;
CREATE VIEW v_pull AS SELECT embkv_pull('u1', 777) AS b;
SELECT * FROM v_pull;
CREATE VIEW v_push AS SELECT embkv_push('sgd', 1, '[1, 1]') AS n;
SELECT * FROM v_push;
CREATE VIEW v_release AS SELECT embkv_release('s0', 1) AS n;
SELECT * FROM v_release;
CREATE TABLE log(x);
CREATE TRIGGER tr AFTER INSERT ON log BEGIN SELECT embkv_push('sgd', new.x, '[1, 1]'); END;
INSERT INTO log VALUES (1);
PRAGMA trusted_schema = ON;
SELECT * FROM v_pull;
INSERT INTO log VALUES (1);
SELECT 'directonly-nothing-done', (SELECT count(*) FROM u1 WHERE id = 777), (SELECT count(*) FROM log), (SELECT clock FROM sgd WHERE id = 1);
DROP VIEW v_pull;
DROP VIEW v_push;
DROP VIEW v_release;
DROP TRIGGER tr;
-- s0 id 1 is left pulled (a permit held) for the next process
SELECT 's0-held', length(embkv_pull('s0', 1));
-- @reopen
-- 10. A new process: trained values and created rows are as they were (a
--     clean close makes them durable), the training counters and the
--     permits (DRAM state) start afresh.
.headers off
.mode list
.nullvalue NULL
SELECT 'reopen-sgd', id, embkv_json(vec), clock FROM sgd ORDER BY id;
SELECT 'reopen-ada', id, embkv_json(vec), clock FROM ada ORDER BY id;
SELECT 'reopen-init', embkv_pull('u1', '[1, 2, 3, 50]') = (SELECT b FROM saved WHERE tab = 'u1');
SELECT 's0-permits-gone', embkv_json(embkv_pull('s0', 1));
SELECT embkv_pull('s0', 1);
SELECT 'reopen-stats', json_extract(embkv_stats('s0'), '$.training');
-- the optimizer state survives too: adagrad's accumulator (acc 9 for id 2's
-- first element after the 1.5+1.5 push): g=4 -> acc 25, step 0.5*4/5
SELECT 'reopen-ada-push', embkv_push('ada', 2, '[4, 0]');
SELECT 'reopen-ada-acc', abs(json_extract(j, '$[0]') - (-0.5 - 0.4)) < 1e-6, json_extract(j, '$[1]'), clock
  FROM (SELECT embkv_json(vec) AS j, clock FROM ada WHERE id = 2);
-- adam's state and step count survive: a third step with the same gradient
-- is again about lr*g/|g|
SELECT 'reopen-adam-push', embkv_push('adam', 1, '[2, -0.5]');
SELECT 'reopen-adam', abs(json_extract(j, '$[0]') + 1.5) < 1e-6, abs(json_extract(j, '$[1]') - 1.5) < 1e-6, clock
  FROM (SELECT embkv_json(vec) AS j, clock FROM adam WHERE id = 1);
-- a table never holds NaN or Inf: an update that overflows float32 leaves
-- its row as it was (the others of the push are updated), and initializers
-- whose values could not be float32 are refused
CREATE VIRTUAL TABLE ovf USING embkv(dim=1, init='zeros', pool_size='16M');
SELECT 'ovf-pull', embkv_json(embkv_pull('ovf', '[1, 2]'));
SELECT embkv_push('ovf', '[1, 1, 2]', '[3e38, 3e38, 1]', 1);
SELECT 'ovf-rows', id, embkv_json(vec), clock FROM ovf ORDER BY id;
SELECT embkv_push('ovf', 1, '[1]', 1e300);
SELECT 'ovf-rows', id, embkv_json(vec), clock FROM ovf ORDER BY id;
SELECT 'ovf-ok', embkv_push('ovf', 1, '[1]', 2);
SELECT 'ovf-rows', id, embkv_json(vec), clock FROM ovf WHERE id = 1;
CREATE VIRTUAL TABLE bad_normal USING embkv(dim=1, init='normal(3e38, 1e37)', pool_size='16M');
CREATE VIRTUAL TABLE bad_uniform USING embkv(dim=1, init='uniform(-1e39, 0)', pool_size='16M');
CREATE VIRTUAL TABLE edge_uniform USING embkv(dim=1, init='uniform(-3e38, 3e38)', pool_size='16M');
SELECT 'edge-uniform', embkv_dims(embkv_pull('edge_uniform', '[1, 2, 3]'));
-- a result over SQLITE_LIMIT_LENGTH is refused before anything is read or created
CREATE VIRTUAL TABLE wide USING embkv(dim=8192, init='zeros', pool_size='16M');
SELECT length(embkv_pull('wide', (SELECT json_group_array(1) FROM generate_series(1, 40000))));
SELECT 'wide-rows', count(*) FROM wide;
-- a JSON gradient past float32's range is refused naming its element
SELECT embkv_push('ovf', '[1, 2]', '[1, 1e39]');
SELECT 'ovf-rows', id, embkv_json(vec), clock FROM ovf ORDER BY id;
-- values of numbers and names are read without blanks around them;
-- staleness is a count as the others are, up to 1000000
CREATE VIRTUAL TABLE blanks USING embkv(dim=2, optimizer=' adagrad ', lr=' 0.5 ', staleness=' 1e3 ',
    pool_size='16M ', dtype=' f16 ', capacity=' 1000');
SELECT 'blanks', json_extract(embkv_stats('blanks'), '$.dtype'), json_extract(embkv_stats('blanks'), '$.state_floats');
CREATE VIRTUAL TABLE bad USING embkv(dim=2, staleness=1000001);
-- the extension's own table names are refused
CREATE VIRTUAL TABLE embkv_knn USING embkv(dim=2);
CREATE VIRTUAL TABLE Embkv_Pending USING embkv(dim=2);
ALTER TABLE blanks RENAME TO embkv_heat;
SELECT 'kept-name', count(*) FROM blanks;
-- a schema with no table after its dot names no table
SELECT embkv_pull('main.', 1);
