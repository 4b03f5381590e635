-- Run once by the mysql image on an empty data directory, in the database named by
-- MYSQL_DATABASE (leaf). The table is Leaf's leaf_alloc unchanged (PROTOCOL.md,
-- "Segment store compatibility"), so a Leaf deployment could share these rows.

CREATE TABLE `leaf_alloc` (
  `biz_tag` varchar(128) NOT NULL DEFAULT '',
  `max_id` bigint(20) NOT NULL DEFAULT '1',
  `step` int(11) NOT NULL,
  `description` varchar(256) DEFAULT NULL,
  `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (`biz_tag`)
) ENGINE=InnoDB;

-- Leaf's sample row: the tag the dispensers' start-up message and bench ask for.
INSERT INTO leaf_alloc (biz_tag, max_id, step, description)
VALUES ('leaf-segment-test', 1, 2000, 'Leaf''s sample tag');
