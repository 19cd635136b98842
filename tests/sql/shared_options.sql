-- Options belong to the store: tables attached to one store (same path)
-- take the store's options; one written with another value is an error
-- naming both; a new process trains the store the same way whichever table
-- it touches first.
.headers off
.mode list
CREATE VIRTUAL TABLE a USING embkv(dim=2, path='shared', pool_size='16M', lr=0.5, init='zeros', optimizer='sgd');
CREATE VIRTUAL TABLE b USING embkv(dim=2, path='shared', lr=10, init='uniform(5,6)');
CREATE VIRTUAL TABLE b USING embkv(dim=2, path='shared', pool_size='256M');
CREATE VIRTUAL TABLE b USING embkv(dim=2, path='shared', capacity=7);
CREATE VIRTUAL TABLE b USING embkv(dim=2, path='shared', staleness=3);
CREATE VIRTUAL TABLE b USING embkv(dim=2, path='shared', lr=0.5, pool_size='16M');
SELECT 'b-pull', embkv_json(embkv_pull('b', 1));
SELECT 'b-push', embkv_push('b', 1, '[1,1]');
SELECT 'a-sees', embkv_json(embkv_pull('a', 1));
-- @reopen
.headers off
.mode list
SELECT 'b-first', embkv_push('b', 1, '[1,1]'), embkv_json(embkv_pull('a', 2));
SELECT 'a-after', embkv_json(embkv_pull('a', 1));
