package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeFile writes content to name in a temp dir and returns the path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParseProperties(t *testing.T) {
	in := "# Leaf\n! also a comment\n  \n" +
		"leaf.name=com.sankuai.leaf.opensource.test\n" +
		"leaf.jdbc.url = jdbc:mysql://db:3306/leaf?a=1\\\n" +
		"    &b=2\n" +
		"leaf.jdbc.username:leaf\n" +
		"leaf.jdbc.password   pa\\:ss\\=w\\\\rd\n" +
		"key\\ with\\ spaces=v\n" +
		"unicode=\\u8ba2\\u5355\n" +
		"utf8=订单\r\n" +
		"empty=\n" +
		"bare\n" +
		"tab\\tkey=x\\ty\n" +
		"dup=1\ndup=2\n"
	got, err := parseProperties([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"leaf.name":          "com.sankuai.leaf.opensource.test",
		"leaf.jdbc.url":      "jdbc:mysql://db:3306/leaf?a=1&b=2",
		"leaf.jdbc.username": "leaf",
		"leaf.jdbc.password": `pa:ss=w\rd`,
		"key with spaces":    "v",
		"unicode":            "订单",
		"utf8":               "订单",
		"empty":              "",
		"bare":               "",
		"tab\tkey":           "x\ty",
		"dup":                "2",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d keys %q, want %d", len(got), got, len(want))
	}
	// Java reads the bytes as ISO-8859-1 when they are not UTF-8.
	if got, err := parseProperties([]byte("k=caf\xe9")); err != nil || got["k"] != "café" {
		t.Errorf("Latin-1 file: %q, %v", got, err)
	}
	if _, err := parseProperties([]byte("k=\\u12")); err == nil {
		t.Error("a malformed \\u escape was accepted")
	}
	// The error names the key, never the value: it may be a password.
	if _, err := parseProperties([]byte("leaf.jdbc.password=s3cr3t\\uZZZZ")); err == nil ||
		strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "leaf.jdbc.password") {
		t.Errorf("a malformed escape in a password = %v: want the key named and the value not", err)
	}
}

// TestJDBCSecretsNotShown: errors and notes about leaf.jdbc.url never carry a password
// from it (they reach the log and the terminal).
func TestJDBCSecretsNotShown(t *testing.T) {
	for _, url := range []string{
		"mysql://db/leaf?user=u&password=s3cr3t",
		"jdbc:postgresql://db/leaf?password=s3cr3t",
		"jdbc:mysql://u:s3cr3t@db/leaf",
		"jdbc:mysql://db1,db2/leaf?password=s3cr3t",
		"jdbc:mysql://db/le%zzaf?password=s3cr3t",
		"jdbc:mysql://db/leaf?password=s3cr3t&x=%zz",
	} {
		_, _, err := jdbcDSN(url, "", "")
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("jdbcDSN(%q) = %v: want an error without the password", url, err)
		}
	}
	_, notes, err := jdbcDSN("jdbc:mysql://db/leaf?trustCertificateKeyStorePassword=s3cr3t&useUnicode=true", "u", "")
	all := strings.Join(notes, "; ")
	if err != nil || strings.Contains(all, "s3cr3t") || !strings.Contains(all, "trustCertificateKeyStorePassword=****") {
		t.Errorf("notes %q, %v: want the parameter named and its value masked", all, err)
	}
}

func TestJDBCDSN(t *testing.T) {
	for _, tt := range []struct {
		name, url, user, pass, want, wantNote, wantErr string
	}{
		{"Leaf", "jdbc:mysql://db:3306/leaf?useUnicode=true&characterEncoding=utf8", "leaf", "pw", "leaf:pw@tcp(db:3306)/leaf", "useUnicode=true", ""},
		{"DefaultPort", "jdbc:mysql://db/leaf", "u", "", "u@tcp(db:3306)/leaf", "", ""},
		{"DefaultHost", "jdbc:mysql:///leaf", "u", "", "u@tcp(localhost:3306)/leaf", "", ""},
		{"IPv6", "jdbc:mysql://[::1]:3307/leaf", "u", "", "u@tcp([::1]:3307)/leaf", "", ""},
		{"MariaDB", "jdbc:mariadb://db:3306/leaf", "u", "", "u@tcp(db:3306)/leaf", "", ""},
		{"Timeouts", "jdbc:mysql://db/leaf?connectTimeout=2000&socketTimeout=3000", "u", "", "u@tcp(db:3306)/leaf?readTimeout=3s&timeout=2s&writeTimeout=3s", "", ""},
		{"UserInURL", "jdbc:mysql://db/leaf?user=x&password=y", "", "", "x:y@tcp(db:3306)/leaf", "", ""},
		{"PropertiesWin", "jdbc:mysql://db/leaf?user=x&password=y", "u", "p", "u:p@tcp(db:3306)/leaf", "", ""},
		{"PasswordSpecialChars", "jdbc:mysql://db/leaf", "u", "p@ss:/w?d", "u:p@ss:/w?d@tcp(db:3306)/leaf", "", ""},
		{"SSLRequired", "jdbc:mysql://db/leaf?sslMode=REQUIRED", "u", "", "u@tcp(db:3306)/leaf?tls=skip-verify", "", ""},
		{"UseSSL", "jdbc:mysql://db/leaf?useSSL=true", "u", "", "u@tcp(db:3306)/leaf?tls=true", "", ""},
		{"UseSSLNoVerify", "jdbc:mysql://db/leaf?useSSL=true&verifyServerCertificate=false", "u", "", "u@tcp(db:3306)/leaf?tls=skip-verify", "", ""},
		{"ErrMissing", "", "u", "", "", "", "missing"},
		{"ErrNotJDBC", "mysql://db/leaf", "u", "", "", "", "does not start with jdbc:"},
		{"ErrOtherDatabase", "jdbc:postgresql://db/leaf", "u", "", "", "", "want jdbc:mysql"},
		{"ErrSeveralHosts", "jdbc:mysql://db1,db2/leaf", "u", "", "", "", "--mysql-dsn"},
		{"ErrLoadBalance", "jdbc:mysql:loadbalance://db1,db2/leaf", "u", "", "", "", "--mysql-dsn"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, notes, err := jdbcDSN(tt.url, tt.user, tt.pass)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("jdbcDSN(%q) = %q, %v; want an error saying %q", tt.url, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("jdbcDSN(%q) = %q, %v; want %q", tt.url, got, err, tt.want)
			}
			if tt.wantNote != "" && !strings.Contains(strings.Join(notes, "; "), tt.wantNote) {
				t.Errorf("notes %q do not name %q", notes, tt.wantNote)
			}
		})
	}
}

// leafProps is a Leaf server's leaf.properties as its README configures it.
const leafProps = `leaf.name=com.sankuai.leaf.opensource.test
leaf.segment.enable=true
leaf.jdbc.url=jdbc:mysql://db:3306/leaf_test?useUnicode=true&characterEncoding=utf8&characterSetResults=utf8
leaf.jdbc.username=root
leaf.jdbc.password=s3cret

leaf.snowflake.enable=true
leaf.snowflake.zk.address=zk1:2181,zk2:2181
leaf.snowflake.port=8081
`

// parseFiles parses args with a fixed host address for --leaf-properties.
func parseFiles(args []string, env map[string]string) (Config, error) {
	c := defaultConfig()
	c.detectIPv4 = func() (string, error) { return "10.1.2.3", nil }
	err := c.parse(args, func(k string) string { return env[k] }, &bytes.Buffer{})
	return c, err
}

// TestLeafProperties: --leaf-properties starts the dispenser a Leaf server with that
// file would have been: MySQL store on its table, ZooKeeper in Leaf's layout under
// leaf.name with this host's IP and Leaf's port, HTTP on that port; every other source
// wins over it.
func TestLeafProperties(t *testing.T) {
	props := writeFile(t, "leaf.properties", leafProps)
	c, err := parseFiles([]string{"--leaf-properties", props, "--nats", "nats://n1:4222"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{
		"segment-store": c.SegmentStore, "mysql-dsn": c.MySQLDSN, "worker-registry": c.WorkerRegistry,
		"zk": c.ZK, "zk-name": c.ZKName, "advertise": c.Advertise, "http": c.HTTP,
	}
	want := map[string]string{
		"segment-store": "mysql", "mysql-dsn": "root:s3cret@tcp(db:3306)/leaf_test", "worker-registry": "zk",
		"zk": "zk1:2181,zk2:2181", "zk-name": "com.sankuai.leaf.opensource.test", "advertise": "10.1.2.3:8081",
		"http": "0.0.0.0:8081",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if !c.HTTPExplicit {
		t.Error("the HTTP address from leaf.properties is not explicit: a taken port would be skipped instead of failing the start")
	}
	if len(c.notes) != 1 || !strings.Contains(c.notes[0], "characterSetResults=utf8") {
		t.Errorf("notes %q, want one naming the JDBC parameters left out", c.notes)
	}

	// Stronger sources win, and a registry chosen elsewhere takes none of Leaf's
	// ZooKeeper settings.
	c, err = parseFiles([]string{"--leaf-properties", props, "--worker-registry", "kv", "--http", "127.0.0.1:9999"},
		map[string]string{"LEAFBUS_MYSQL_DSN": "u:p@tcp(other:3306)/leaf"})
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerRegistry != "kv" || c.ZK != "" || c.Advertise != "" || c.HTTP != "127.0.0.1:9999" || c.MySQLDSN != "u:p@tcp(other:3306)/leaf" || c.SegmentStore != "mysql" {
		t.Errorf("overrides: %+v", c.Config)
	}

	// Leaf's defaults: a missing enable key is true; anything but "true" is false.
	for _, tt := range []struct {
		name, file, wantErr string
		check               func(Config) bool
	}{
		{"SegmentOnly", "leaf.segment.enable=TRUE\nleaf.jdbc.url=jdbc:mysql://db/leaf\nleaf.jdbc.username=u\nleaf.snowflake.enable=false\n", "",
			func(c Config) bool {
				return c.SegmentStore == "mysql" && c.WorkerRegistry == "kv" && c.HTTP == "127.0.0.1:8080"
			}},
		{"SnowflakeOnly", "leaf.name=n\nleaf.segment.enable=no\nleaf.snowflake.zk.address=zk:2181\nleaf.snowflake.port=8080\n", "",
			func(c Config) bool {
				return c.SegmentStore == "kv" && c.WorkerRegistry == "zk" && c.Advertise == "10.1.2.3:8080"
			}},
		{"ErrSegmentWithoutURL", "leaf.snowflake.enable=false\n", "leaf.jdbc.url is missing", nil},
		{"ErrSnowflakeWithoutZK", "leaf.segment.enable=false\nleaf.name=n\nleaf.snowflake.port=8080\n", "leaf.snowflake.zk.address is missing", nil},
		{"ErrSnowflakeWithoutName", "leaf.segment.enable=false\nleaf.snowflake.zk.address=zk:2181\nleaf.snowflake.port=8080\n", "leaf.name is missing", nil},
		{"ErrSnowflakeWithoutPort", "leaf.segment.enable=false\nleaf.name=n\nleaf.snowflake.zk.address=zk:2181\n", "leaf.snowflake.port is missing", nil},
		{"ErrBadPort", "leaf.segment.enable=false\nleaf.snowflake.enable=false\nleaf.snowflake.port=http\n", "want a port number", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"--leaf-properties", writeFile(t, "leaf.properties", tt.file)}
			c, err := parseFiles(args, nil)
			if tt.wantErr != "" {
				wantUsageError(t, args, err, tt.wantErr)
				return
			}
			if err != nil || !tt.check(c) {
				t.Fatalf("%v: %+v", err, c.Config)
			}
		})
	}
	if _, err := parseFiles([]string{"--leaf-properties", filepath.Join(t.TempDir(), "none")}, nil); err == nil {
		t.Error("a missing leaf.properties was accepted")
	}
}

// TestConfigFile: --config sets any flag by its name, under the command line and the
// environment and over --leaf-properties; a key that is no flag is an error.
func TestConfigFile(t *testing.T) {
	props := writeFile(t, "leaf.properties", leafProps)
	file := writeFile(t, "leafbus.yaml", `# a deployment's settings
nats: nats://n1:4222,nats://n2:4222
node-id: disp-7
max-batch: 5000
sample-tag: false
pool:
  - segment:orders:100:4
  - snowflake:order%3Acreate:50:2
zk-name: from-config
leaf-properties: `+props+`
http: ""
`)
	c, err := parseFiles([]string{"--config", file, "--max-batch", "7000"}, map[string]string{"LEAFBUS_NODE_ID": "disp-env"})
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS != "nats://n1:4222,nats://n2:4222" || c.NodeID != "disp-env" || c.MaxBatch != 7000 || c.SampleTag ||
		len(c.Pools) != 2 || c.Pools[1].Tag != "order:create" || c.ZKName != "from-config" || c.HTTP != "" ||
		c.SegmentStore != "mysql" || c.ZK != "zk1:2181,zk2:2181" {
		t.Errorf("config: %+v", c.Config)
	}
	for _, tt := range []struct{ name, yaml, wantErr string }{
		{"UnknownKey", "segment-stor: mysql\n", `"segment-stor" is not a flag`},
		{"Nested", "segment-store:\n  kind: mysql\n", "takes one value"},
		{"ListForScalar", "node-id: [a, b]\n", "takes one value"},
		{"BadValue", "max-batch: many\n", "--max-batch"},
		{"ConfigInConfig", "config: other.yaml\n", "only be given on the command line"},
		{"Twice", "node-id: a\nnode-id: b\n", ""},
		{"NotAMapping", "- a\n- b\n", "want a mapping"},
		{"ModeRules", "zk-name: x\n", "--zk-name is only used with --worker-registry zk"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"--config", writeFile(t, "c.yaml", tt.yaml)}
			_, err := parseFiles(args, nil)
			wantUsageError(t, args, err, tt.wantErr)
		})
	}
	if c, err := parseFiles([]string{}, map[string]string{"LEAFBUS_CONFIG": writeFile(t, "c.yaml", "node-id: from-env-file\n")}); err != nil || c.NodeID != "from-env-file" {
		t.Errorf("LEAFBUS_CONFIG: %v, node ID %q", err, c.NodeID)
	}
	if c, err := parseFiles([]string{"--config", writeFile(t, "empty.yaml", "")}, nil); err != nil || c.NodeID == "" {
		t.Errorf("an empty --config: %v", err)
	}
}

// TestPrintConfig: dispenser --print-config prints the configuration as a --config
// file, each value's source in a comment and the defaults commented out, secrets masked,
// and exits 0 without starting; given back as --config, it gives the same configuration.
func TestPrintConfig(t *testing.T) {
	props := writeFile(t, "leaf.properties", leafProps)
	var stdout, stderr bytes.Buffer
	args := []string{"--print-config", "--leaf-properties", props, "--nats", "nats://op:natspw@n1:4222",
		"--user", "disp", "--password", "pw-secret", "--service-token", "tok-secret", "--pool", "segment:a%20b:10:2",
		"--advertise", "10.9.9.9:8081"}
	if code := runCommand(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, secret := range []string{"pw-secret", "tok-secret", "s3cret", "natspw"} {
		if strings.Contains(out, secret) {
			t.Errorf("the output shows the secret %q:\n%s", secret, out)
		}
	}
	for _, line := range []string{
		"mysql-dsn: root:*****@tcp(db:3306)/leaf_test # leaf.properties leaf.jdbc.url, leaf.jdbc.username, leaf.jdbc.password\n",
		"zk-name: com.sankuai.leaf.opensource.test # leaf.properties leaf.name\n",
		"advertise: 10.9.9.9:8081 # --advertise\n",
		"password: '*****' # --password\n",
		"pool: [segment:a%20b:10:2] # --pool\n",
		"nats: nats://n1:4222 # --nats\n",
		"# max-batch: 10000\n",
		"# sample-tag: true\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("no line %q in\n%s", line, out)
		}
	}
	if strings.Contains(out, "\nprint-config:") || strings.Contains(out, "\nconfig:") || strings.Contains(out, "# config:") {
		t.Errorf("the control flags are printed:\n%s", out)
	}
	// Round trip, the secrets given again.
	again := writeFile(t, "again.yaml", strings.NewReplacer("'*****'", "pw-secret", "root:*****@", "root:s3cret@").Replace(out))
	c, err := parseFiles([]string{"--config", again, "--nats", "nats://op:natspw@n1:4222", "--service-token", "tok-secret"}, nil)
	if err != nil {
		t.Fatalf("the printed configuration does not parse: %v\n%s", err, out)
	}
	if c.MySQLDSN != "root:s3cret@tcp(db:3306)/leaf_test" || c.Advertise != "10.9.9.9:8081" || c.Pools.String() != "segment:a%20b:10:2" || c.ZKName != "com.sankuai.leaf.opensource.test" {
		t.Errorf("round trip: %+v", c.Config)
	}
}

// TestGCPercent: the dispenser collects garbage at GOGC=400 unless GOGC is set.
func TestGCPercent(t *testing.T) {
	if pct, ok := gcPercent(func(string) string { return "" }); !ok || pct != 400 {
		t.Errorf("without GOGC: %d, %v; want 400, true", pct, ok)
	}
	if _, ok := gcPercent(func(k string) string { return map[string]string{"GOGC": "100"}[k] }); ok {
		t.Error("GOGC=100 in the environment is overridden")
	}
}

// continuedProperties is a leaf.properties file of about size bytes whose one value is
// continued over lines of 10 characters, as a hostile or broken file may be.
func continuedProperties(size int) []byte {
	var b strings.Builder
	b.WriteString("leaf.name=")
	for b.Len() < size {
		b.WriteString("abcdefgh\\\n")
	}
	b.WriteString("end\nleaf.jdbc.username=leaf\n")
	return []byte(b.String())
}

// TestParsePropertiesLongContinuation: a 1 MB logical line of continuations is read
// whole, within a bound that the old quadratic join (16.5 s for 1 MB, far more under
// -race) does not meet; BenchmarkParsePropertiesContinuation shows the growth.
func TestParsePropertiesLongContinuation(t *testing.T) {
	t.Parallel()
	data := continuedProperties(1 << 20)
	done := make(chan error, 1)
	go func() {
		props, err := parseProperties(data)
		if err == nil && (len(props["leaf.name"]) < 800_000 || !strings.HasSuffix(props["leaf.name"], "abcdefghend") || props["leaf.jdbc.username"] != "leaf") {
			err = fmt.Errorf("leaf.name of %d bytes, username %q", len(props["leaf.name"]), props["leaf.jdbc.username"])
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a 1 MB continued line not parsed within 30s")
	}
}

func BenchmarkParsePropertiesContinuation(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10, 1 << 20} {
		data := continuedProperties(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := parseProperties(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
