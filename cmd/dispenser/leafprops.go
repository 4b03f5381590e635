package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/internal/boundedfile"
)

// --leaf-properties: a Leaf server's own leaf.properties, read as that server reads it
// (java.util.Properties), turned into the flags that start a dispenser as that server
// would have run (PROTOCOL.md "Configuration files"):
//
//	leaf.segment.enable (default true)   --segment-store mysql, --mysql-dsn from
//	  leaf.jdbc.url, .username, .password  the JDBC URL, user and password
//	leaf.snowflake.enable (default true) --worker-registry zk, --zk leaf.snowflake.zk.address,
//	  leaf.name, leaf.snowflake.port       --zk-name leaf.name, --advertise <this host's IPv4>:port
//	leaf.snowflake.port                  --http 0.0.0.0:port (Leaf's server port, all interfaces)
//
// Leaf's defaults hold: a missing enable key means true (Boolean.parseBoolean of
// "true"), and a value other than "true" in any case means false. A disabled kind keeps
// the dispenser's own default (the KV store, the KV registry) rather than Leaf's
// ZeroIDGen, which answers 0 to every request.

// leafProperties is what --leaf-properties sets: flag values (a flag may take several,
// as --pool does) and where each came from, for --print-config; notes say what of the
// file was left out, for the log.
type leafProperties struct {
	flags  map[string]string
	source map[string]string
	notes  []string
}

// readLeafProperties reads path and maps it to flags; ip is this host's IPv4 address as
// Leaf finds it (firstIPv4), asked only when the snowflake part is enabled.
func readLeafProperties(path string, ip func() (string, error)) (leafProperties, error) {
	data, err := boundedfile.Read("--leaf-properties", path, maxConfigFileBytes)
	if err != nil {
		return leafProperties{}, err
	}
	props, err := parseProperties(data)
	if err != nil {
		return leafProperties{}, fmt.Errorf("--leaf-properties %s: %w", path, err)
	}
	lp, err := mapLeafProperties(props, ip)
	if err != nil {
		return leafProperties{}, fmt.Errorf("--leaf-properties %s: %w", path, err)
	}
	return lp, nil
}

// mapLeafProperties turns Leaf's keys into flags.
func mapLeafProperties(props map[string]string, ip func() (string, error)) (leafProperties, error) {
	lp := leafProperties{flags: map[string]string{}, source: map[string]string{}}
	set := func(flag, value, from string) {
		lp.flags[flag] = value
		lp.source[flag] = "leaf.properties " + from
	}
	enabled := func(key string) bool {
		v, ok := props[key]
		return !ok || strings.EqualFold(v, "true") // Boolean.parseBoolean(getProperty(key, "true"))
	}
	var errs []error
	if enabled("leaf.segment.enable") {
		dsn, notes, err := jdbcDSN(props["leaf.jdbc.url"], props["leaf.jdbc.username"], props["leaf.jdbc.password"])
		if err != nil {
			errs = append(errs, fmt.Errorf("leaf.segment.enable is true: %w", err))
		}
		set("segment-store", "mysql", "leaf.segment.enable")
		set("mysql-dsn", dsn, "leaf.jdbc.url, leaf.jdbc.username, leaf.jdbc.password")
		lp.notes = append(lp.notes, notes...)
	}
	port, hasPort := props["leaf.snowflake.port"]
	if hasPort {
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			errs = append(errs, fmt.Errorf("leaf.snowflake.port %q: want a port number from 1 to 65535", port))
			hasPort = false
		} else {
			set("http", net.JoinHostPort("0.0.0.0", port), "leaf.snowflake.port")
		}
	}
	if enabled("leaf.snowflake.enable") {
		zk := props["leaf.snowflake.zk.address"]
		name := props["leaf.name"]
		switch {
		case zk == "":
			errs = append(errs, errors.New("leaf.snowflake.enable is true but leaf.snowflake.zk.address is missing"))
		case strings.Contains(zk, "/"):
			errs = append(errs, fmt.Errorf("leaf.snowflake.zk.address %q has a chroot path, which the dispenser does not take: give --zk without it", zk))
		}
		if name == "" {
			errs = append(errs, errors.New("leaf.snowflake.enable is true but leaf.name is missing (worker IDs live under /snowflake/<leaf.name>)"))
		}
		if !hasPort && props["leaf.snowflake.port"] == "" {
			errs = append(errs, errors.New("leaf.snowflake.enable is true but leaf.snowflake.port is missing (the port Leaf registers its worker ID under)"))
		}
		set("worker-registry", "zk", "leaf.snowflake.enable")
		set("zk", zk, "leaf.snowflake.zk.address")
		set("zk-name", name, "leaf.name")
		if hasPort {
			addr, err := ip()
			if err != nil {
				errs = append(errs, fmt.Errorf("leaf.snowflake.port: %w: give --advertise ip:port", err))
			} else {
				set("advertise", net.JoinHostPort(addr, port), "leaf.snowflake.port and this host's IPv4 address")
			}
		}
	}
	for _, k := range []string{"leaf.snowflake.mode", "leaf.snowflake.local.workIdMap"} {
		if v, ok := props[k]; ok && (k != "leaf.snowflake.mode" || v != "zk") {
			lp.notes = append(lp.notes, fmt.Sprintf("%s=%s is not read (a fork's key): the worker ID comes from ZooKeeper in Leaf's layout; use --worker-registry for another", k, v))
		}
	}
	return lp, errors.Join(errs...)
}

// jdbcDSN turns Leaf's JDBC URL (jdbc:mysql://host[:port]/db?params) and credentials into
// a go-sql-driver DSN. Connector/J's own parameters are left out, except the ones with
// a counterpart: connectTimeout and socketTimeout (ms), and TLS (useSSL, sslMode,
// verifyServerCertificate). user and password in the URL count when the properties have
// none. notes name every parameter left out.
func jdbcDSN(jdbc, user, password string) (string, []string, error) {
	if jdbc == "" {
		return "", nil, errors.New("leaf.jdbc.url is missing")
	}
	rest, ok := strings.CutPrefix(jdbc, "jdbc:")
	if !ok {
		return "", nil, fmt.Errorf("leaf.jdbc.url %q does not start with jdbc:", jdbcShown(jdbc))
	}
	scheme, rest, ok := strings.Cut(rest, "://")
	if !ok || scheme != "mysql" && scheme != "mariadb" {
		return "", nil, fmt.Errorf("leaf.jdbc.url %q: want jdbc:mysql://host:port/database (load-balanced, replication and address=() forms: give --mysql-dsn)", jdbcShown(jdbc))
	}
	hosts, rest, _ := strings.Cut(rest, "/")
	dbPart, query, _ := strings.Cut(rest, "?")
	// A user@ or user:password@ in the URL is refused, wherever its characters put it:
	// a "/" or "?" in the password ends the hosts early, and the rest lands in the port
	// or the database name.
	_, port, splitErr := net.SplitHostPort(hosts)
	userInfo := strings.Contains(hosts, "@") || strings.ContainsAny(dbPart, "@/") ||
		splitErr == nil && strings.Trim(port, "0123456789") != ""
	if strings.Contains(hosts, ",") || strings.HasPrefix(hosts, "address=") || userInfo {
		return "", nil, fmt.Errorf("leaf.jdbc.url %q names its hosts in a form the dispenser does not read (several hosts, address=(...), user@host): give --mysql-dsn", jdbcShown(jdbc))
	}
	addr := hosts
	if addr == "" {
		addr = "localhost"
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(strings.Trim(addr, "[]"), "3306")
	}
	db, err := url.PathUnescape(dbPart)
	if err != nil {
		return "", nil, fmt.Errorf("leaf.jdbc.url %q: the database name is not percent-encoded right", jdbcShown(jdbc))
	}
	params, err := url.ParseQuery(query)
	if err != nil {
		// err quotes the bad escape, which may be in a password.
		return "", nil, fmt.Errorf("leaf.jdbc.url %q: its parameters are not percent-encoded right", jdbcShown(jdbc))
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName, cfg.User, cfg.Passwd = "tcp", addr, db, user, password
	var notes, ignored []string
	ms := func(name string) time.Duration {
		v := params.Get(name)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			notes = append(notes, fmt.Sprintf("leaf.jdbc.url: %s=%s is not a number of milliseconds: left out", name, v))
			return 0
		}
		return time.Duration(n) * time.Millisecond
	}
	tls := ""
	for name := range params {
		switch strings.ToLower(name) {
		case "user":
			if cfg.User == "" {
				cfg.User = params.Get(name)
			}
		case "password":
			if cfg.Passwd == "" {
				cfg.Passwd = params.Get(name)
			}
		case "connecttimeout":
			cfg.Timeout = ms(name)
		case "sockettimeout":
			cfg.ReadTimeout = ms(name)
			cfg.WriteTimeout = cfg.ReadTimeout
		case "usessl":
			if strings.EqualFold(params.Get(name), "true") && tls == "" {
				tls = "true"
			}
		case "sslmode":
			switch strings.ToUpper(params.Get(name)) {
			case "REQUIRED", "PREFERRED":
				tls = "skip-verify"
			case "VERIFY_CA", "VERIFY_IDENTITY":
				tls = "true"
			}
		}
	}
	// The parameters left out, in the URL's order. After a secret's parameter, an "&"
	// may have been the password's own: names and values after it are counted, not
	// shown, and so is a parameter without "=".
	hidden, afterSecret := 0, false
	for _, raw := range strings.Split(query, "&") {
		name, value, hasValue := strings.Cut(raw, "=")
		name, _ = url.QueryUnescape(name)
		value, _ = url.QueryUnescape(value)
		switch lower := strings.ToLower(name); {
		case raw == "" || lower == "user" && !afterSecret || lower == "password" ||
			lower == "connecttimeout" || lower == "sockettimeout" || lower == "usessl" || lower == "sslmode" || lower == "verifyservercertificate":
			afterSecret = afterSecret || lower == "password"
		case !hasValue || afterSecret:
			hidden++
		default:
			ignored = append(ignored, name+"="+shownParam(name, value))
			afterSecret = afterSecret || shownParam(name, "") != ""
		}
	}
	if hidden > 0 {
		ignored = append(ignored, fmt.Sprintf("%d more not shown (after a password, or without =)", hidden))
	}
	if tls == "true" && strings.EqualFold(params.Get("verifyServerCertificate"), "false") {
		tls = "skip-verify"
	}
	cfg.TLSConfig = tls
	if len(ignored) > 0 {
		notes = append(notes, fmt.Sprintf("leaf.jdbc.url: Connector/J parameters with no go-sql-driver counterpart are left out: %s", strings.Join(ignored, "&")))
	}
	return cfg.FormatDSN(), notes, nil
}

// jdbcShown is a JDBC URL as errors may quote it: without its parameters, which can
// hold user and password (and whose errors are not the URL's), and with any user@ (a
// form it refuses anyway) cut to "...@".
func jdbcShown(jdbc string) string {
	// The last "@" first: a "?" may be in the password before it.
	shown := jdbc
	if at := strings.LastIndex(shown, "@"); at >= 0 {
		if start := strings.Index(shown, "//"); start >= 0 && start < at {
			shown = shown[:start+2] + "...@" + shown[at+1:]
		} else {
			shown = "...@" + shown[at+1:]
		}
	}
	if before, query, ok := strings.Cut(shown, "?"); ok && query != "" {
		shown = before + "?..."
	}
	return shown
}

// shownParam is a JDBC parameter's value as a note may show it: masked when its name
// says it is a secret (Connector/J's trustCertificateKeyStorePassword and the like).
func shownParam(name, value string) string {
	lower := strings.ToLower(name)
	for _, secret := range []string{"password", "secret", "token", "credential", "pwd"} {
		if strings.Contains(lower, secret) {
			return "****"
		}
	}
	return value
}

// firstIPv4 is this host's address as Leaf's Utils.getIp finds it: the first IPv4
// address that is not loopback (nor 0.0.0.0). Leaf takes it from a HashSet, so on a host
// with several the choice was arbitrary there too: give --advertise to choose.
func firstIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("list interface addresses: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsUnspecified() && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", errors.New("this host has no IPv4 address besides loopback")
}

// parseProperties reads a .properties file as java.util.Properties.load does: logical
// lines joined at a trailing unescaped backslash, comments (# or !) and blank lines
// skipped, a key ending at the first unescaped '=', ':' or white space, the escapes \t
// \n \r \f \uXXXX and \x for any other x. Java reads the bytes as ISO-8859-1; a file that
// is valid UTF-8 is read as UTF-8 here, which is what its author meant.
func parseProperties(data []byte) (map[string]string, error) {
	text := string(data)
	if !utf8.Valid(data) {
		runes := make([]rune, len(data))
		for i, b := range data {
			runes[i] = rune(b)
		}
		text = string(runes)
	}
	props := map[string]string{}
	lines := strings.Split(strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimLeft(lines[i], " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		if endsInEscape(line) {
			// Joined in one builder: joining line by line copied the text so far at
			// every line, quadratic in a logical line's length. A piece's own trailing
			// backslashes decide whether the next line continues it, as in Java.
			var b strings.Builder
			b.WriteString(line[:len(line)-1])
			for more := true; more && i+1 < len(lines); {
				i++
				next := strings.TrimLeft(lines[i], " \t\f")
				if more = endsInEscape(next); more {
					next = next[:len(next)-1] // a continuation at the end of the file too
				}
				b.WriteString(next)
			}
			line = b.String()
		}
		key, value := splitProperty(line)
		k, err := unescapeProperty(key)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		v, err := unescapeProperty(value)
		if err != nil {
			return nil, fmt.Errorf("line %d: the value of %s: %w", i+1, k, err)
		}
		props[k] = v
	}
	return props, nil
}

// endsInEscape reports whether line ends with an odd number of backslashes.
func endsInEscape(line string) bool {
	n := 0
	for i := len(line) - 1; i >= 0 && line[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// splitProperty splits a logical line at the end of its key, still escaped.
func splitProperty(line string) (key, value string) {
	i := 0
	for ; i < len(line); i++ {
		c := line[i]
		if c == '\\' {
			i++
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f' {
			break
		}
	}
	key, rest := line[:min(i, len(line))], line[min(i, len(line)):]
	rest = strings.TrimLeft(rest, " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	return key, rest
}

// unescapeProperty resolves a key's or value's escapes.
func unescapeProperty(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			// The text is not quoted: it may be a password.
			if i+5 > len(s) {
				return "", fmt.Errorf("malformed \\uxxxx escape at byte %d", i-1)
			}
			n, err := strconv.ParseUint(s[i+1:i+5], 16, 16)
			if err != nil {
				return "", fmt.Errorf("malformed \\uxxxx escape at byte %d", i-1)
			}
			b.WriteRune(rune(n))
			i += 4
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), nil
}
