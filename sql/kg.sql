-- Analytics over the WordNet knowledge graph trained by pysample/train_kg.py
-- (TransE: entity rows in the embkv table `entity`, relation rows in
-- `relation`; synsets, relations and triples in ordinary tables):
--
--   python3 pysample/train_kg.py --db kg.db        (or: make demo-kg)
--   sqlite3 -cmd '.load build/embkv' build/kg-demo.db < sql/kg.sql
.headers on
.mode column

-- The synsets nearest to "dog" (the first noun synset named so) in the
-- embedding space: the nearest rows by L2, joined with their names.
SELECT k.rank, s.name, s.pos, round(k.distance, 3) AS distance
  FROM embkv_knn('entity',
                 (SELECT vec FROM entity
                   WHERE id = (SELECT id FROM synsets WHERE name = 'dog' AND pos = 'n' ORDER BY id LIMIT 1)),
                 8) AS k
  JOIN synsets AS s ON s.id = k.id
 ORDER BY k.rank;

-- What the model predicts as the hypernym of "dog": the entities nearest
-- to e_dog + w_hypernym (TransE's h + r ~ t), with WordNet's own answer.
SELECT k.rank, s.name,
       EXISTS (SELECT 1 FROM triples AS tr
                WHERE tr.h = (SELECT id FROM synsets WHERE name = 'dog' AND pos = 'n' ORDER BY id LIMIT 1)
                  AND tr.r = (SELECT id FROM relations WHERE name = 'hypernym') AND tr.t = k.id) AS in_wordnet
  FROM embkv_knn('entity',
                 embkv_add((SELECT vec FROM entity
                             WHERE id = (SELECT id FROM synsets WHERE name = 'dog' AND pos = 'n' ORDER BY id LIMIT 1)),
                           (SELECT vec FROM relation WHERE id = (SELECT id FROM relations WHERE name = 'hypernym'))),
                 5) AS k
  JOIN synsets AS s ON s.id = k.id
 ORDER BY k.rank;

-- How well each relation is modelled: the mean of ||e_h + w_r - e_t|| over
-- its training triples, and over its held-out ones (a relation the model
-- fits has both small).
SELECT r.name, count(*) AS triples,
       round(avg(CASE WHEN NOT t.held_out THEN embkv_l2(embkv_add(eh.vec, er.vec), et.vec) END), 3) AS train_dist,
       round(avg(CASE WHEN t.held_out THEN embkv_l2(embkv_add(eh.vec, er.vec), et.vec) END), 3) AS held_out_dist
  FROM triples AS t
  JOIN relations AS r ON r.id = t.r
  JOIN entity AS eh ON eh.id = t.h
  JOIN entity AS et ON et.id = t.t
  JOIN relation AS er ON er.id = t.r
 GROUP BY r.id
 ORDER BY triples DESC;

-- Hits@10 of 100 held-out hypernym triples, one embkv_knn per triple
-- (raw, not filtered: the train_kg.py report filters the other answers).
SELECT count(*) AS held_out, sum(hit) AS hits_at_10
  FROM (SELECT t.t IN (SELECT id FROM embkv_knn('entity', embkv_add(eh.vec, er.vec), 10)) AS hit
          FROM triples AS t
          JOIN entity AS eh ON eh.id = t.h
          JOIN relation AS er ON er.id = t.r
         WHERE t.held_out AND t.r = (SELECT id FROM relations WHERE name = 'hypernym')
         LIMIT 100);
