-- Everyday scalar functions: predicates, casts, strings, dates, arrays,
-- conditionals, case-insensitive names and literals (written for distfusion,
-- in the format of Spark's sql-tests inputs).
CREATE OR REPLACE TEMPORARY VIEW f AS SELECT * FROM VALUES
  (1, 'Spark SQL', DATE '2024-02-29', 1.5D, ARRAY(3, 1, NULL, 2), true),
  (2, 'datafusion', DATE '2023-12-31', -0.0D, ARRAY(), false),
  (3, NULL, NULL, CAST('NaN' AS DOUBLE), NULL, NULL),
  (4, '  padded  ', DATE '1999-01-01', 1e300D, ARRAY(5), true)
  AS f(id, s, d, x, arr, flag);

SELECT NOT true, true AND NULL, false AND NULL, true OR NULL, NULL OR false;
SELECT 1 IN (1, 2, NULL), 4 IN (1, 2, NULL), NULL IN (1), 1 NOT IN (2, NULL), 1 NOT IN (2, 3);
SELECT 1 BETWEEN 0 AND 2, 0.5 BETWEEN 0 AND 1, 'b' BETWEEN 'a' AND 'c', 3 NOT BETWEEN 1 AND 2;
SELECT 1 = '1', 2 > '1.0', '1.5' > 0.5, 1.5 = '1.51';
SELECT id, flag, NOT flag, flag IS TRUE, flag IS NOT FALSE FROM f;
SELECT id, upper(s), lower(s), length(s), concat(s, '!'), s || '?' FROM f;
SELECT id, substring(s, 2, 3), substr(s, 1), trim(s), ltrim(s), rtrim(s) FROM f;
SELECT id, s LIKE 'S%', s ILIKE 'spark%', s RLIKE 'a.a', s LIKE '%f_sion' FROM f;
SELECT id, replace(s, 'a', 'A'), reverse(s), lpad(s, 12, '*'), rpad(s, 3, '-') FROM f;
SELECT id, instr(s, 'a'), locate('a', s), split(s, ' '), initcap(s), repeat(s, 2) FROM f;
SELECT concat_ws('-', 'a', NULL, 'b'), 'a' || 'b' || 'c', concat('a', NULL);
SELECT CAST('12' AS INT), CAST(12.7 AS INT), CAST(-12.7 AS BIGINT), CAST(3 AS STRING);
SELECT CAST('abc' AS INT);
SELECT CAST(2147483648 AS INT);
SELECT CAST(128 AS TINYINT);
SELECT CAST('2024-02-30' AS DATE);
SELECT try_cast('abc' AS INT), try_cast('7' AS INT);
SELECT CAST(1.5D AS STRING), CAST(1e20D AS STRING), CAST(0.1D AS STRING), CAST(x AS STRING) FROM f;
SELECT CAST(x AS DECIMAL(10, 2)) FROM f WHERE id <> 4 AND id <> 3;
SELECT CAST(true AS INT), CAST('true' AS BOOLEAN), CAST(0 AS BOOLEAN), CAST('1.50' AS DECIMAL(4, 2));
SELECT id, d, year(d), month(d), day(d), dayofweek(d), dayofyear(d), quarter(d), weekofyear(d) FROM f;
SELECT id, date_add(d, 1), date_sub(d, 1), datediff(d, DATE '2024-01-01'), d + 30, last_day(d) FROM f;
SELECT id, date_format(d, 'yyyy-MM-dd'), date_format(d, 'dd/MM/yy'), date_format(d, 'EEE, MMM d') FROM f;
SELECT id, to_date('2024-03-01'), to_date('01/03/2024', 'dd/MM/yyyy'), add_months(d, 1) FROM f;
SELECT to_timestamp('2024-03-01 10:11:12'), to_timestamp('2024/03/01', 'yyyy/MM/dd');
SELECT make_date(2024, 2, 29), trunc(DATE '2024-05-17', 'MM'), date_trunc('YEAR', DATE '2024-05-17');
SELECT id, arr, size(arr), array_contains(arr, 1), sort_array(arr), sort_array(arr, false) FROM f;
SELECT id, element_at(arr, 1), arr[0], array_max(arr), array_min(arr), array_distinct(arr) FROM f;
SELECT array(1, 2, 3), array(), array(1, NULL), array_position(array(3, 1), 1);
SELECT id, explode(arr) FROM f;
SELECT id, e FROM f LATERAL VIEW explode(arr) t AS e;
SELECT id, e FROM f LATERAL VIEW OUTER explode(arr) t AS e;
SELECT id, posexplode(arr) FROM f;
SELECT id, pos, e FROM f LATERAL VIEW posexplode(arr) t AS pos, e;
SELECT id, if(flag, 'yes', 'no'), CASE WHEN x > 1 THEN 'big' WHEN x < 0 THEN 'neg' ELSE 'other' END FROM f;
SELECT id, coalesce(s, 'none'), nvl2(s, 1, 0), greatest(id, 2), least(id, 2) FROM f;
SELECT id, x, isnan(x), nanvl(x, 0D), abs(x), sign(x) FROM f;
SELECT id, floor(x), ceil(x), sqrt(abs(x)), pow(x, 2) FROM f WHERE id < 3;
SELECT ID, S FROM F WHERE Id = 1;
SELECT f.ID AS Ident, `s` FROM f ORDER BY ident;
SELECT 1, -1, 2147483648, 9223372036854775807, 1L, 1S, 1Y, 1.5, 1.5D, 1.5F, 1e10, 'it''s', "dq", X'1F', DATE '2024-01-01';
SELECT 0.1BD, 1e2BD, -0.0, 1.0E0;
SELECT 9223372036854775807 + 1;
SELECT 2147483647 + 1;
SELECT 1 / 0;
SELECT 5 % 0;
SELECT abs(-2147483648);
