-- GROUP BY, HAVING and grouping analytics: Spark's trailing WITH CUBE / WITH
-- ROLLUP / GROUPING SETS forms, grouping() (written for distfusion, in the
-- format of Spark's sql-tests inputs).
CREATE OR REPLACE TEMPORARY VIEW g AS SELECT * FROM VALUES
  (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (NULL, 1), (3, NULL), (NULL, NULL)
  AS g(a, b);
CREATE OR REPLACE TEMPORARY VIEW sales AS SELECT * FROM VALUES
  ('dotNET', 2012, 10000), ('Java', 2012, 20000), ('dotNET', 2012, 5000),
  ('dotNET', 2013, 48000), ('Java', 2013, 30000)
  AS sales(course, year, earnings);

SELECT a, count(b) FROM g GROUP BY a;
SELECT count(a), count(b) FROM g GROUP BY a;
SELECT a + b, count(b) FROM g GROUP BY a + b;
SELECT 'foo', count(a) FROM g GROUP BY 1;
SELECT a, count(1) FROM g WHERE false GROUP BY a;
SELECT count(1) FROM g WHERE false;
SELECT count(DISTINCT a), count(DISTINCT b) FROM g;
SELECT count(DISTINCT a, b) FROM g;
SELECT a, b, sum(b) FROM g GROUP BY a, b WITH CUBE;
SELECT a, b, sum(b) FROM g GROUP BY a, b WITH ROLLUP;
SELECT a + b, b, sum(a - b) FROM g GROUP BY a + b, b WITH ROLLUP;
SELECT course, year, sum(earnings) FROM sales GROUP BY ROLLUP(course, year) ORDER BY course, year;
SELECT course, year, sum(earnings) FROM sales GROUP BY CUBE(course, year) ORDER BY course, year;
SELECT course, year, sum(earnings) FROM sales GROUP BY course, year GROUPING SETS(course, year);
SELECT course, year, sum(earnings) FROM sales GROUP BY course, year GROUPING SETS(course, year, ());
SELECT course, year, sum(earnings) FROM sales GROUP BY course, year GROUPING SETS((course), (course, year));
SELECT course, year, sum(earnings) FROM sales GROUP BY GROUPING SETS((course), (year)) ORDER BY 1, 2;
SELECT course, year, grouping(course), grouping(year) FROM sales GROUP BY CUBE(course, year);
SELECT course, year, grouping(course) FROM sales GROUP BY course, year;
SELECT course, year FROM sales GROUP BY CUBE(course, year) HAVING grouping(year) = 1 ORDER BY course;
SELECT course, sum(earnings) AS s FROM sales GROUP BY course HAVING sum(earnings) > 60000;
SELECT course, sum(earnings) AS s FROM sales GROUP BY course HAVING s < 60000 ORDER BY s;
SELECT year, max(earnings) FROM sales GROUP BY year HAVING max(earnings) > 40000;
SELECT course FROM sales GROUP BY course ORDER BY sum(earnings) DESC;
SELECT min(year) FROM (SELECT * FROM sales WHERE earnings > 0) t HAVING count(1) > 0;
SELECT a, sort_array(collect_list(b)), sort_array(collect_set(b)) FROM g WHERE a IS NOT NULL AND b IS NOT NULL GROUP BY a;
SELECT b, stddev(a), variance(a), stddev_pop(a), var_pop(a) FROM g GROUP BY b;
