-- Window functions and frames (written for distfusion, in the format of
-- Spark's sql-tests inputs).
CREATE OR REPLACE TEMPORARY VIEW w AS SELECT * FROM VALUES
  (NULL, 1L, 1.0D, 'a'), (1, 1L, 1.0D, 'a'), (1, 2L, 2.5D, 'a'), (2, 2147483650L, 100.001D, 'a'),
  (1, NULL, 1.0D, 'b'), (2, 3L, 3.3D, 'b'), (3, 2147483650L, 100.001D, 'b'),
  (NULL, NULL, NULL, NULL), (3, 1L, 1.0D, NULL)
  AS w(val, val_long, val_double, cate);
CREATE OR REPLACE TEMPORARY VIEW pays AS SELECT * FROM VALUES
  ('Diane', 'Accounting', 8435), ('Mary', 'Accounting', 9998), ('Jeff', 'Accounting', 8992),
  ('William', 'Accounting', 8870), ('Gerard', 'Accounting', 11472), ('Leslie', 'IT', 8113),
  ('Lee', 'IT', 5186), ('Julie', 'Sales', 9181), ('Steve', 'Sales', 9441), ('Foon', 'Sales', 6660)
  AS pays(name, department, salary);

SELECT val, cate, count(val) OVER (PARTITION BY cate ORDER BY val ROWS CURRENT ROW) FROM w ORDER BY cate, val;
SELECT val, cate, sum(val) OVER (PARTITION BY cate ORDER BY val ROWS BETWEEN UNBOUNDED PRECEDING AND 1 FOLLOWING) FROM w ORDER BY cate, val;
SELECT val, cate, count(val) OVER (PARTITION BY cate ORDER BY val RANGE 1 PRECEDING) FROM w ORDER BY cate, val;
SELECT val, cate, sum(val) OVER (PARTITION BY cate ORDER BY val RANGE BETWEEN CURRENT ROW AND 1 FOLLOWING) FROM w ORDER BY cate, val;
SELECT val, cate, sum(val) OVER (PARTITION BY cate ORDER BY val DESC RANGE BETWEEN CURRENT ROW AND 1 FOLLOWING) FROM w ORDER BY cate, val;
SELECT val_long, cate, sum(val_long) OVER (PARTITION BY cate ORDER BY val_long ROWS BETWEEN CURRENT ROW AND 2 FOLLOWING) FROM w ORDER BY cate, val_long;
SELECT val, cate,
  max(val) OVER x, min(val) OVER x, count(val) OVER x, sum(val) OVER x, avg(val) OVER x,
  rank() OVER x, dense_rank() OVER x, row_number() OVER x, cume_dist() OVER x, percent_rank() OVER x,
  ntile(2) OVER x, first_value(val) OVER x, last_value(val) OVER x
FROM w WINDOW x AS (PARTITION BY cate ORDER BY val) ORDER BY cate, val;
SELECT val, cate, stddev(val) OVER x, var_pop(val) OVER x, var_samp(val) OVER x
FROM w WINDOW x AS (PARTITION BY cate ORDER BY val) ORDER BY cate, val;
SELECT val, cate, sum(val) OVER (), avg(val) OVER () FROM w ORDER BY cate, val;
SELECT val, cate, lag(val) OVER (PARTITION BY cate ORDER BY val), lead(val, 2, -1) OVER (PARTITION BY cate ORDER BY val) FROM w ORDER BY cate, val;
SELECT name, salary, first_value(name) OVER (ORDER BY salary DESC) FROM pays ORDER BY salary DESC;
SELECT name, salary, nth_value(name, 2) OVER (ORDER BY salary DESC) FROM pays ORDER BY salary DESC;
SELECT name, department, salary, rank() OVER (PARTITION BY department ORDER BY salary DESC) AS r FROM pays ORDER BY department, r;
SELECT name, salary, sum(salary) OVER (ORDER BY salary RANGE BETWEEN 2000 PRECEDING AND 1000 FOLLOWING) FROM pays ORDER BY salary;
SELECT department, avg(salary) OVER (PARTITION BY department) FROM pays ORDER BY department;
SELECT * FROM (SELECT name, department, row_number() OVER (PARTITION BY department ORDER BY salary DESC) AS rn FROM pays) WHERE rn = 1;
