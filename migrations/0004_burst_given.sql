-- Whether a subscriber's burst was set on its own. A burst left unset is
-- twice the rate, and a PATCH of the rate alone moves it with the rate; a
-- set one stays. Before this column only the value told them apart, so a
-- set burst that equalled twice the rate moved too. Rows written before it
-- count as set whenever the value shows it.
ALTER TABLE subscribers ADD COLUMN rate_burst_given INTEGER NOT NULL DEFAULT 0;
UPDATE subscribers
   SET rate_burst_given = 1
 WHERE rate_burst != min(max(1, 2 * rate_per_second), 1000000);
