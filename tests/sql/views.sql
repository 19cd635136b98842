-- Views and triggers over an embkv table: allowed while the schema is
-- trusted (SQLite's default), refused with PRAGMA trusted_schema=OFF;
-- functions with side effects are never allowed from a view or trigger.
.load ./build/embkv
PRAGMA trusted_schema = ON;
CREATE VIRTUAL TABLE item USING embkv(dim=2);
INSERT INTO item(id, vec) VALUES (1, '[1,2]'), (2, '[3,4]');
CREATE VIEW item_norms AS SELECT id, round(embkv_norm(vec), 4) AS norm FROM item;
SELECT 'view', * FROM item_norms ORDER BY id;
CREATE TABLE events (id INTEGER, x REAL);
CREATE TRIGGER ev AFTER INSERT ON events BEGIN
  INSERT OR REPLACE INTO item(id, vec) VALUES (new.id, json_array(new.x, new.x));
END;
INSERT INTO events VALUES (3, 0.5);
SELECT 'trigger', id, embkv_json(vec) FROM item WHERE id = 3;
CREATE VIEW pulls AS SELECT embkv_pull('item', 1) AS v;
SELECT * FROM pulls;
PRAGMA trusted_schema = OFF;
SELECT 'untrusted', * FROM item_norms;
INSERT INTO events VALUES (4, 1.5);
SELECT 'direct', count(*) FROM item;
