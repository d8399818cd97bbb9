-- Decimal arithmetic: Spark's result types, rounding and precision loss
-- (written for distfusion, in the format of Spark's sql-tests inputs).
CREATE OR REPLACE TEMPORARY VIEW d AS SELECT id, CAST(a AS DECIMAL(38, 18)) AS a,
  CAST(b AS DECIMAL(38, 18)) AS b, CAST(c AS DECIMAL(10, 2)) AS c FROM VALUES
  (1, 100.0, 999.0, 1.25), (2, 12345.123, 12345.123, -2.50),
  (3, 0.1234567891011, 1234.1, 0.05), (4, 123456789123456789.0, 1.123456789123456789, NULL)
  AS t(id, a, b, c);

SELECT id, a + b, a - b FROM d ORDER BY id;
SELECT id, c * 3, c / 3, c + 1.005, c * c FROM d ORDER BY id;
SELECT id, c * 10, b / 10 FROM d WHERE id < 4 ORDER BY id;
SELECT sum(c), avg(c), min(c), max(c) FROM d;
SELECT round(c, 1), round(c), round(2.675, 2), round(-2.5) FROM d;
SELECT 10.3 * 3.0, 10.3000 * 3.0, 10.30000 * 30.0;
SELECT 10.300000000000000000 * 3.000000000000000000;
SELECT 12345678912345678912345678912.1234567 + 9999999999999999999999999999999.12345;
SELECT 1.0 / 3, 2 / 3.00, 7 / 2, 7 div 2, 7 % 3, -7 % 3;
SELECT CAST(20 AS DECIMAL(4, 1)) UNION ALL SELECT CAST(10 AS DECIMAL(3, 1)) + CAST(90 AS DECIMAL(3, 1));
SELECT CAST(20 AS DECIMAL(4, 1)) UNION ALL SELECT CAST(10 AS DECIMAL(3, 1)) / CAST(10 AS DECIMAL(3, 1));
SELECT CASE WHEN id > 2 THEN c ELSE 1.5 END, coalesce(c, 0.125) FROM d;
SELECT 1.0 / 0.0;
SELECT c / 0 FROM d;

SET spark.sql.decimalOperations.allowPrecisionLoss=false;
SELECT id, a + b, a - b FROM d ORDER BY id;
SELECT id, c * 3, c / 3 FROM d ORDER BY id;
