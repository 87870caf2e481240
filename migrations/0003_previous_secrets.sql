-- Every secret rotated out in the last 24 hours keeps signing, not only the
-- last one: a JSON array of {"secret", "until_ms"}, newest first.
ALTER TABLE subscribers ADD COLUMN previous_secrets TEXT NOT NULL DEFAULT '[]';
UPDATE subscribers
   SET previous_secrets = json_array(json_object('secret', previous_secret, 'until_ms', previous_until))
 WHERE previous_secret != '';
ALTER TABLE subscribers DROP COLUMN previous_secret;
ALTER TABLE subscribers DROP COLUMN previous_until;
