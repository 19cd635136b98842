-- Vector functions and aggregates: every function, every error, NULL and
-- empty cases.  Inputs are chosen so that every result is exactly
-- representable (float32 elements, double reductions).
.headers off
.mode list
.nullvalue NULL
.bail off

-- embkv_vec: JSON text -> float32 little-endian BLOB; a BLOB passes through.
SELECT 'vec', hex(embkv_vec('[1, -2, 0.5]')), hex(embkv_vec(x'0000803f')), hex(embkv_vec(' [ 0 ] '));
SELECT 'vec-round', hex(embkv_vec('[16777217, 1e-50, -0.0]'));
SELECT 'vec-null', embkv_vec(NULL);
-- embkv_json: shortest decimal that reads back to the same float32.
SELECT 'json', embkv_json(embkv_vec('[0.1, 1e-45, 3.4028235e38, -0.0, 16777217, 1e20, 0.333333333333, 2.5]'));
SELECT 'json-style', embkv_json('[10, 100, 1e7, 1e15, 1e16, 0.0001, 1e-5, -2.5e-7, 123.456, 1.5]');
SELECT 'json-text', embkv_json('[ 1 , 2.0 , -3e0 ]'), embkv_json(NULL);
-- Round trip, bit for bit, over 1000 awkward values.
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000),
     v(b) AS (SELECT embkv_vec(json_group_array(((i * 7919) % 2003 - 1001) / 997.0 * pow(10.0, (i % 61) - 30))) FROM n)
SELECT 'json-roundtrip', embkv_dims(b), embkv_vec(embkv_json(b)) = b FROM v;
-- embkv_dims
SELECT 'dims', embkv_dims('[1,2,3]'), embkv_dims(x'0000803f00000040'), embkv_dims(zeroblob(32768)), embkv_dims(NULL);
-- embkv_dot, embkv_norm, embkv_l2 (Euclidean distance)
SELECT 'dot', embkv_dot('[1,2,3]', '[4,5,6]'), embkv_dot(embkv_vec('[1,2,3]'), '[-1,0,0.5]'), embkv_dot(NULL, '[1]'), embkv_dot('[1]', NULL);
-- accumulation is in double: a float32 sum would lose the 1
SELECT 'dot-double', embkv_dot('[16777216, 1, -16777216]', '[1, 1, 1]');
SELECT 'norm', embkv_norm('[3,4]'), embkv_norm('[1,1,1,1]'), embkv_norm('[0,0]'), embkv_norm(zeroblob(400000)), embkv_norm(NULL);
SELECT 'l2', embkv_l2('[1,2]', '[4,6]'), embkv_l2('[1,2]', '[1,2]'), embkv_l2(NULL, '[1]');
-- embkv_cosine: similarity in [-1, 1]; NULL when either vector is zero.
SELECT 'cosine', embkv_cosine('[1,0]', '[0,1]'), embkv_cosine('[1,2]', '[2,4]'), embkv_cosine('[3,4]', '[-3,-4]'), embkv_cosine('[3,4]', '[4,3]'), embkv_cosine('[1,0]', '[1,1]');
SELECT 'cosine-zero', embkv_cosine('[0,0]', '[1,2]'), embkv_cosine('[1,2]', '[0,0]'), embkv_cosine('[0]', '[0]'), embkv_cosine(NULL, '[1]');
-- element-wise: embkv_add, embkv_sub, embkv_scale
SELECT 'add', embkv_json(embkv_add('[1,2]', '[0.5,-4]')), embkv_add(NULL, '[1]');
SELECT 'sub', embkv_json(embkv_sub('[1,2]', '[0.5,-4]')), embkv_sub('[1]', NULL);
SELECT 'scale', embkv_json(embkv_scale('[1,-2]', 3)), embkv_json(embkv_scale('[1,2]', 0.5)), embkv_json(embkv_scale('[1,2]', 0)), embkv_json(embkv_scale('[0]', -1)), embkv_scale('[1]', NULL), embkv_scale(NULL, 2);
SELECT 'scale-blob', hex(embkv_scale(x'0000803f', 2));
-- aggregates: NULL rows skipped, no rows (or only NULLs) -> NULL
CREATE TABLE v(g INTEGER, x);
INSERT INTO v VALUES (1, '[1,2]'), (1, NULL), (1, embkv_vec('[3,4]')), (1, '[2,6]'),
                     (2, NULL), (3, '[16777216]'), (3, '[1]'), (3, '[1]'), (3, '[-16777216]');
SELECT 'agg', g, embkv_json(embkv_sum(x)), embkv_json(embkv_avg(x)) FROM v GROUP BY g ORDER BY g;
SELECT 'agg-empty', embkv_sum(x), embkv_avg(x) FROM v WHERE g = 99;
SELECT 'agg-null', embkv_sum(x), embkv_avg(x) FROM v WHERE g = 2;
SELECT 'agg-all', count(x), embkv_dims(embkv_sum(x)) FROM v WHERE g = 1;
-- as window functions
SELECT 'window', rowid, embkv_json(embkv_sum(x) OVER w), embkv_json(embkv_avg(x) OVER w)
FROM v WHERE g <= 2 WINDOW w AS (ORDER BY rowid ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) ORDER BY rowid;
-- version and build
SELECT 'version', embkv_version();
SELECT 'build', json_valid(embkv_build()), json_extract(embkv_build(), '$.version') = embkv_version(),
       json_extract(embkv_build(), '$.liburing'), json_extract(embkv_build(), '$.pm_detection'),
       json_type(embkv_build(), '$.cuda') IN ('true', 'false');

-- Errors.  Each statement fails with a message naming the function.
SELECT embkv_vec('[1,"a"]');
SELECT embkv_vec('[1,[2]]');
SELECT embkv_vec('[[[[[[[[[[1]]]]]]]]]]');
SELECT embkv_vec('[1,null]');
SELECT embkv_vec('[true]');
SELECT embkv_vec('[1,2');
SELECT embkv_vec('[1, 2] x');
SELECT embkv_vec('[nan]');
SELECT embkv_vec('{"a":1}');
SELECT embkv_vec('"[1]"');
SELECT embkv_vec('');
SELECT embkv_vec('[]');
SELECT embkv_vec(x'');
SELECT embkv_vec(x'000000');
SELECT embkv_vec(x'0000803f00');
SELECT embkv_vec('[1e999]');
SELECT embkv_vec('[1, -1e39]');
SELECT embkv_vec(x'0000803f0000c07f');
SELECT embkv_vec(x'0000807f');
SELECT embkv_vec(42);
SELECT embkv_vec(4.5);
SELECT embkv_vec(replace(hex(zeroblob(2000)), '00', '['));
SELECT embkv_json(x'000080ff');
SELECT embkv_json('abc');
SELECT embkv_dims(x'00');
SELECT embkv_dims('[]');
SELECT embkv_dot('[1,2]', '[1]');
SELECT embkv_dot(x'0000803f', '[1,2]');
SELECT embkv_dot(x'00', '[1]');
SELECT embkv_dot('[1]', 7);
SELECT embkv_dot(x'0000c07f', '[1]');
SELECT embkv_cosine('[1,2,3]', '[1,2]');
SELECT embkv_cosine('[1]', 'x');
SELECT embkv_l2('[1]', '[1,2]');
SELECT embkv_l2(x'0000807f', '[1]');
SELECT embkv_norm('[1,2');
SELECT embkv_norm(x'0000c07f');
SELECT embkv_add('[1]', '[1,2]');
SELECT embkv_add('[3e38]', '[3e38]');
SELECT embkv_sub('[1,2]', x'0000803f');
SELECT embkv_sub('[-3e38]', '[3e38]');
SELECT embkv_scale('[1]', 'two');
SELECT embkv_scale('[1]', x'00');
SELECT embkv_scale('[1]', 1e999);
SELECT embkv_scale('[3e38]', 2);
SELECT embkv_scale(1, 2);
SELECT embkv_sum(x) FROM (SELECT '[1,2]' AS x UNION ALL SELECT '[1]');
SELECT embkv_avg(x) FROM (SELECT '[1]' AS x UNION ALL SELECT 'oops');
SELECT embkv_sum(x) FROM (SELECT '[3e38]' AS x UNION ALL SELECT '[3e38]');
SELECT embkv_dot('[1]');
-- window frames: a huge row that leaves does not take the small ones with
-- it (compensated sum), and a frame that empties starts over (a new dimension)
CREATE TEMP TABLE wf(i INTEGER, x);
INSERT INTO wf VALUES (1, '[1e30]'), (2, '[1]'), (3, '[1]'), (4, '[1]');
SELECT 'window-huge', i, embkv_json(embkv_sum(x) OVER w), embkv_json(embkv_avg(x) OVER w)
FROM wf WINDOW w AS (ORDER BY i ROWS 1 PRECEDING) ORDER BY i;
CREATE TEMP TABLE wd(i INTEGER, x);
INSERT INTO wd VALUES (1, '[1,2]'), (2, NULL), (3, '[1]'), (4, '[2]');
SELECT 'window-redim', i, embkv_json(embkv_sum(x) OVER w), embkv_json(embkv_avg(x) OVER w)
FROM wd WINDOW w AS (ORDER BY i ROWS 1 PRECEDING) ORDER BY i;
-- numbers as JSON writes them, as a table's INSERT takes them
SELECT embkv_vec('[01]');
SELECT embkv_vec('[1., 2]');
SELECT embkv_vec('[+1]');
SELECT embkv_vec('[0x10]');
SELECT embkv_json(embkv_vec('[0, -0.5, 1e2, "x"]'));
SELECT 'json numbers', hex(embkv_vec('[0, -0.5, 1e2, 10]'));
SELECT 'done';
