-- embkv analytics: embedding tables joined with an ordinary dataset table.
--
-- Run it with `bash sql/analytics.sh` (a fresh temporary directory, cleaned up
-- after), or by hand from the repository root after `make`:
--     sqlite3 analytics.db < sql/analytics.sql
--
-- The data is synthetic and deterministic (integer arithmetic only, no
-- random()), so the output is the same on every run; tests check it.
--   users(id, vec)  embkv table, 200 users, dim 16
--   items(id, vec)  embkv table, 500 items, dim 16
--   clicks(user_id, item_id, label)  a plain table: 40 impressions per user,
--                   label 1 = clicked.  Clicks are drawn so that they follow
--                   the model: P(click) = sigmoid(dot(user, item)).
.load ./build/embkv
.headers on
.mode list

-- Each user has a taste (id % 8) and each item a genre (id % 8); a vector is
-- its group's centre plus noise, so users score items of their own group
-- higher.  Element j of a centre (weight 0.5) and of the noise (weight 0.3)
-- is h(x) = (x * 2654435761 mod 4294967291) mod 2001 / 1000 - 1, a number in
-- [-1, 1] hashed from an integer x that names the group or row and j.
CREATE VIRTUAL TABLE users USING embkv(dim=16, path='users.embkv');
CREATE VIRTUAL TABLE items USING embkv(dim=16, path='items.embkv');
CREATE TEMP VIEW k AS
  WITH RECURSIVE k(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j < 15)
  SELECT j FROM k;
WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < 200)
INSERT INTO users(id, vec)
SELECT id, (SELECT embkv_vec(json_group_array(
              0.5 * (((1000000 + (id % 8) * 16 + j) * 2654435761 % 4294967291) % 2001 / 1000.0 - 1.0)
            + 0.3 * (((2000000 + id * 16 + j) * 2654435761 % 4294967291) % 2001 / 1000.0 - 1.0)))
            FROM k)
FROM n;
WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < 500)
INSERT INTO items(id, vec)
SELECT id, (SELECT embkv_vec(json_group_array(
              0.5 * (((1000000 + (id % 8) * 16 + j) * 2654435761 % 4294967291) % 2001 / 1000.0 - 1.0)
            + 0.3 * (((3000000 + id * 16 + j) * 2654435761 % 4294967291) % 2001 / 1000.0 - 1.0)))
            FROM k)
FROM n;

-- Impressions: user u sees items (37u + 101s) mod 500 + 1, s = 0..39 (40
-- distinct items).  The label compares a uniform number h(u, i) in [0, 1)
-- (a hash of the pair) with a sigmoid of the model score.  The sigmoid is
-- the algebraic 0.5 + 0.5 x / (1 + |x|), which needs no math functions.
CREATE TABLE clicks(user_id INTEGER, item_id INTEGER, label INTEGER,
                    PRIMARY KEY (user_id, item_id));
WITH RECURSIVE s(s) AS (SELECT 0 UNION ALL SELECT s + 1 FROM s WHERE s < 39),
  imp AS (SELECT u.id AS user_id, (37 * u.id + 101 * s.s) % 500 + 1 AS item_id
          FROM users u, s)
INSERT INTO clicks
SELECT imp.user_id, imp.item_id,
       ((imp.user_id * 1000003 + imp.item_id) * 2654435761 % 4294967291) / 4294967291.0
         < 0.5 + 0.5 * (2 * embkv_dot(u.vec, i.vec)) / (1 + abs(2 * embkv_dot(u.vec, i.vec)))
FROM imp JOIN users u ON u.id = imp.user_id JOIN items i ON i.id = imp.item_id;

.print '-- 1. the dataset'
SELECT (SELECT count(*) FROM users) AS users, (SELECT count(*) FROM items) AS items,
       count(*) AS impressions, sum(label) AS clicks, printf('%.4f', avg(label)) AS ctr
FROM clicks;

-- 2. Score every impression: a join of the plain table with both embedding
--    tables (each join is a point lookup `id = ?` into the embkv table).
CREATE TABLE scored AS
SELECT c.user_id, c.item_id, c.label, embkv_dot(u.vec, i.vec) AS score
FROM clicks c JOIN users u ON u.id = c.user_id JOIN items i ON i.id = c.item_id;

.print
.print '-- 2. score = embkv_dot(user.vec, item.vec) per impression (first 5)'
SELECT user_id, item_id, label, printf('%.6f', score) AS score
FROM scored ORDER BY user_id, item_id LIMIT 5;

.print
.print '-- 3. mean score by label'
SELECT label, count(*) AS n, printf('%.6f', avg(score)) AS mean_score
FROM scored GROUP BY label ORDER BY label;

-- 4. AUC of the scores against the labels, rank-based (Mann-Whitney U):
--    rank all impressions by score (tied scores share their average rank),
--    then AUC = (sum of the positives' ranks - P(P+1)/2) / (P N), the
--    probability that a random click outscores a random non-click.
.print
.print '-- 4. AUC of score vs label (Mann-Whitney U, window functions)'
WITH ranked AS (
  SELECT label,
         rank() OVER (ORDER BY score) + (count(*) OVER (PARTITION BY score) - 1) / 2.0 AS r
  FROM scored),
totals AS (
  SELECT sum(label) AS pos, sum(1 - label) AS neg,
         sum(CASE WHEN label = 1 THEN r ELSE 0 END) AS pos_rank_sum
  FROM ranked)
SELECT pos, neg,
       printf('%.6f', (pos_rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)) AS auc
FROM totals;

.print
.print '-- 5. top-5 items most similar to item 1 (genre 1) by embkv_cosine'
SELECT j.id AS item_id, j.id % 8 AS genre, printf('%.6f', embkv_cosine(i.vec, j.vec)) AS cosine
FROM items i, items j
WHERE i.id = 1 AND j.id <> 1
ORDER BY embkv_cosine(i.vec, j.vec) DESC, j.id LIMIT 5;

-- 6. A per-user profile: the mean vector (embkv_avg) of the items the user
--    clicked.  It should point the way of the user's own vector.
CREATE TABLE profile AS
SELECT c.user_id, count(*) AS clicks, embkv_avg(i.vec) AS vec
FROM clicks c JOIN items i ON i.id = c.item_id
WHERE c.label = 1 GROUP BY c.user_id;

.print
.print '-- 6. per-user mean vector of clicked items (embkv_avg), users 1-3'
SELECT p.user_id, p.clicks, embkv_dims(p.vec) AS dims,
       printf('%.6f', embkv_norm(p.vec)) AS norm,
       printf('%.6f', embkv_cosine(p.vec, u.vec)) AS cosine_to_user
FROM profile p JOIN users u ON u.id = p.user_id
WHERE p.user_id <= 3 ORDER BY p.user_id;
SELECT embkv_json(vec) AS user_1_profile FROM profile WHERE user_id = 1;

.print
.print '-- 7. mean cosine(profile, user) over all users, against a shuffled pairing'
SELECT printf('%.6f', avg(embkv_cosine(p.vec, u.vec))) AS own_user,
       printf('%.6f', avg(embkv_cosine(p.vec, v.vec))) AS other_user
FROM profile p
JOIN users u ON u.id = p.user_id
JOIN users v ON v.id = (p.user_id * 7) % 200 + 1;
