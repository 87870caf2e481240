-- The stats window (attempts and latency of the last 5 minutes) is counted
-- in memory as outcomes commit. These two indexes served only its queries
-- and cost a b-tree insert each per delivery.
DROP INDEX deliveries_sent;
DROP INDEX attempts_at;
