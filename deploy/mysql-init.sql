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

-- The image made MYSQL_USER (leaf) the owner of the whole database; a dispenser needs
-- only these (README "MySQL segments" gives the grants per role). Leaf's own grants are
-- SELECT and UPDATE; INSERT lets operators add tags with `dispenser tag add`.
REVOKE ALL PRIVILEGES ON `leaf`.* FROM 'leaf'@'%';
GRANT SELECT, INSERT, UPDATE ON `leaf`.`leaf_alloc` TO 'leaf'@'%';
