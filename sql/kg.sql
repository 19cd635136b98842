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

-- TransE reads a relation as a translation: e_dog + w_hypernym should be
-- near dog's hypernyms.  Where WordNet's own hypernyms of "dog" rank among
-- the 1000 entities nearest to it (hyponym-heavy relations are TransE's
-- weak point: a translation cannot point at one parent from many children).
WITH d(id) AS (SELECT id FROM synsets WHERE name = 'dog' AND pos = 'n' ORDER BY id LIMIT 1),
     hyp(id) AS (SELECT id FROM relations WHERE name = 'hypernym'),
     q(v) AS (SELECT embkv_add((SELECT vec FROM entity WHERE id = (SELECT id FROM d)),
                               (SELECT vec FROM relation WHERE id = (SELECT id FROM hyp))))
SELECT s.name AS hypernym, k.rank, round(k.distance, 3) AS distance
  FROM embkv_knn('entity', (SELECT v FROM q), 1000) AS k
  JOIN synsets AS s ON s.id = k.id
 WHERE k.id IN (SELECT t FROM triples WHERE h = (SELECT id FROM d) AND r = (SELECT id FROM hyp))
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
