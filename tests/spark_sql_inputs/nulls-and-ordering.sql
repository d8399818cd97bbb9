-- NULLs through arithmetic, CASE, predicates and aggregates; NULL order in
-- ORDER BY and in windows (written for distfusion, in the format of Spark's
-- sql-tests inputs).
CREATE OR REPLACE TEMPORARY VIEW n AS SELECT * FROM VALUES
  (1, 0, 0, 'x'), (2, 0, 1, 'y'), (3, 1, 0, NULL), (4, 1, 1, 'x'),
  (5, NULL, 0, 'y'), (6, NULL, 1, NULL), (7, NULL, NULL, 'z')
  AS n(id, b, c, s);

SELECT id, b + c, b * 0, b - c FROM n;
SELECT DISTINCT b FROM n;
SELECT b FROM n UNION SELECT c FROM n;
SELECT id, CASE b WHEN c THEN 1 ELSE 0 END, CASE WHEN NOT b <> 0 THEN 1 ELSE 0 END FROM n;
SELECT id, CASE WHEN NOT (b <> 0 AND c <> 0) THEN 1 ELSE 0 END FROM n;
SELECT id, CASE WHEN b <> 0 OR c <> 0 THEN 1 ELSE 0 END FROM n;
SELECT count(*), count(b), sum(b), avg(b), min(b), max(b) FROM n;
SELECT id FROM n WHERE NOT (b < 10 AND c = 1);
SELECT id, b <=> c, b = c, b IS NULL, coalesce(b, c, -1) FROM n;
SELECT id, nvl(s, '-'), ifnull(b, 9), nullif(b, 1) FROM n;

-- NULL order: Spark's defaults and every explicit form
SELECT id, b FROM n ORDER BY b, id;
SELECT id, b FROM n ORDER BY b DESC, id;
SELECT id, b FROM n ORDER BY b ASC NULLS FIRST, id;
SELECT id, b FROM n ORDER BY b NULLS LAST, id;
SELECT id, b FROM n ORDER BY b DESC NULLS FIRST, id DESC;
SELECT id, b FROM n ORDER BY b DESC NULLS LAST, id;
SELECT id, s, c FROM n ORDER BY s NULLS LAST, c DESC NULLS FIRST, id;
SELECT id, b, c FROM n ORDER BY c DESC NULLS FIRST, b NULLS LAST, id LIMIT 4;
SELECT id, b,
  sum(id) OVER (ORDER BY b NULLS LAST, id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS w
FROM n ORDER BY id;
SELECT id, b,
  row_number() OVER (PARTITION BY c ORDER BY b DESC NULLS FIRST, id) AS r
FROM n ORDER BY id;
SELECT id, b,
  sum(id) OVER (ORDER BY b DESC NULLS LAST, id ROWS BETWEEN 2 PRECEDING AND 2 FOLLOWING) AS w
FROM n ORDER BY w, id;
