package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
)

// There is no Docker engine where the tests run, so these tests read docker-compose.yml,
// the Dockerfile and deploy/ the way Compose and the programs in the image would, and
// check them against the real flag sets, the real configuration validation and each
// other. They catch the usual drift: a renamed flag, a typo in a LEAFBUS_ variable, a
// service renamed in one place only, an unpinned image.

const (
	composePath    = "../../docker-compose.yml"
	dockerfilePath = "../../Dockerfile"
	deployDir      = "../../deploy"
	benchDir       = "../bench"
)

// composeFile is the part of the Compose specification these checks read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Networks map[string]struct {
		IPAM struct {
			Config []struct {
				Subnet string `yaml:"subnet"`
			} `yaml:"config"`
		} `yaml:"ipam"`
	} `yaml:"networks"`
	Volumes map[string]any `yaml:"volumes"`
}

type composeService struct {
	Image       string     `yaml:"image"`
	Build       any        `yaml:"build"`
	Entrypoint  stringList `yaml:"entrypoint"`
	Command     stringList `yaml:"command"`
	Environment envMap     `yaml:"environment"`
	DependsOn   dependsOn  `yaml:"depends_on"`
	Profiles    []string   `yaml:"profiles"`
	Volumes     []string   `yaml:"volumes"`
	Networks    map[string]struct {
		IPv4Address string `yaml:"ipv4_address"`
	} `yaml:"networks"`
	Healthcheck *struct {
		Test stringList `yaml:"test"`
	} `yaml:"healthcheck"`
}

// stringList is a Compose command or entrypoint: a list, or one string split at spaces.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = strings.Fields(n.Value)
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = s
	return nil
}

// envMap is a Compose environment block: a mapping, or a list of NAME=value.
type envMap map[string]string

func (e *envMap) UnmarshalYAML(n *yaml.Node) error {
	*e = envMap{}
	if n.Kind == yaml.SequenceNode {
		var items []string
		if err := n.Decode(&items); err != nil {
			return err
		}
		for _, it := range items {
			k, v, _ := strings.Cut(it, "=")
			(*e)[k] = v
		}
		return nil
	}
	m := map[string]string{}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		(*e)[k] = v
	}
	return nil
}

// dependsOn is a Compose depends_on: a list of services, or a mapping service ->
// {condition: ...}.
type dependsOn map[string]string // service -> condition ("" in the list form)

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, s := range names {
			(*d)[s] = ""
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for s, c := range m {
		(*d)[s] = c.Condition
	}
	return nil
}

// loadCompose reads the file as Compose does, with the passwords of a secrets file
// made by deploy/secrets.sh as .env would give them: each service's environment and
// command are interpolated.
func loadCompose(tb testing.TB) *composeFile {
	tb.Helper()
	b, err := os.ReadFile(composePath)
	if err != nil {
		tb.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		tb.Fatalf("parse %s: %v", composePath, err)
	}
	if len(f.Services) == 0 {
		tb.Fatalf("%s: no services", composePath)
	}
	vars := deploySecrets(tb)
	for name, s := range f.Services {
		for k, v := range s.Environment {
			s.Environment[k] = interpolate(tb, name+" "+k, v, vars)
		}
		for i, a := range s.Command {
			s.Command[i] = interpolate(tb, name+" command", a, vars)
		}
		f.Services[name] = s
	}
	return &f
}

// deploySecrets runs deploy/secrets.sh, as README's runbook and docker-compose.yml's
// header do, and returns the secrets file it prints.
func deploySecrets(tb testing.TB) map[string]string {
	tb.Helper()
	out, err := exec.Command("sh", filepath.Join(deployDir, "secrets.sh")).Output()
	if err != nil {
		tb.Fatalf("deploy/secrets.sh: %v", err)
	}
	vars := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || v == "" {
			tb.Fatalf("deploy/secrets.sh printed %q: want NAME=value lines", line)
		}
		vars[k] = v
	}
	return vars
}

// composeVar is a Compose interpolation: ${NAME}, ${NAME:?err}, ${NAME?err},
// ${NAME:-default}, ${NAME-default}, or $NAME; $$ is a dollar sign.
var composeVar = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[?-])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// interpolate replaces the variables in v as Compose does from vars (what .env holds);
// a variable required with ? that vars lacks fails tb, naming where.
func interpolate(tb testing.TB, where, v string, vars map[string]string) string {
	tb.Helper()
	return composeVar.ReplaceAllStringFunc(v, func(m string) string {
		if m == "$$" {
			return "$"
		}
		sub := composeVar.FindStringSubmatch(m)
		name, op, arg := sub[1], sub[2], sub[3]
		if name == "" {
			name = sub[4]
		}
		val, ok := vars[name]
		switch {
		case ok && (val != "" || !strings.HasPrefix(op, ":")):
			return val
		case strings.HasSuffix(op, "-"):
			return arg
		case strings.HasSuffix(op, "?"):
			tb.Errorf("%s: Compose would refuse: %s is not set (%s)", where, name, arg)
		}
		return val
	})
}

// program is what a service runs: "dispenser" or "bench" for the leafbus image (built
// from the Dockerfile, whose entrypoint is the dispenser), "" for other images.
func (s composeService) program() string {
	if s.Build == nil {
		return ""
	}
	if len(s.Entrypoint) == 0 {
		return "dispenser"
	}
	return filepath.Base(s.Entrypoint[0])
}

// servicesRunning returns the names of the services that run prog, sorted.
func (f *composeFile) servicesRunning(prog string) []string {
	var names []string
	for name, s := range f.Services {
		if s.program() == prog {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// servicesWithImage returns the names of the services whose image starts with repo+":".
func (f *composeFile) servicesWithImage(repo string) []string {
	var names []string
	for name, s := range f.Services {
		if strings.HasPrefix(s.Image, repo+":") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// flagArgs returns the names of the flags among args (-name, --name, --name=value), in
// order. Every argument of our commands is a flag or a flag's value.
func flagArgs(args []string) []string {
	var names []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		names = append(names, name)
	}
	return names
}

// TestComposeShape checks that the file has the production shape: three NATS nodes,
// MySQL, three ZooKeeper servers, two dispensers and bench under a profile.
func TestComposeShape(t *testing.T) {
	f := loadCompose(t)
	for _, c := range []struct {
		what string
		got  []string
		want int
	}{
		{"NATS servers (image nats)", f.servicesWithImage("nats"), 3},
		{"MySQL servers (image mysql)", f.servicesWithImage("mysql"), 1},
		{"ZooKeeper servers (image zookeeper)", f.servicesWithImage("zookeeper"), 3},
		{"dispensers", f.servicesRunning("dispenser"), 2},
		{"Prometheus servers (image prom/prometheus)", f.servicesWithImage("prom/prometheus"), 1},
		{"Grafana servers (image grafana/grafana)", f.servicesWithImage("grafana/grafana"), 1},
		{"bench services", f.servicesRunning("bench"), 1},
	} {
		if len(c.got) != c.want {
			t.Errorf("%s: got %d %v, want %d", c.what, len(c.got), c.got, c.want)
		}
	}
	for _, name := range f.servicesRunning("bench") {
		if !slices.Contains(f.Services[name].Profiles, "bench") {
			t.Errorf("service %s: profiles %v, want it under the bench profile so that `up` leaves it out", name, f.Services[name].Profiles)
		}
	}
	for _, name := range f.servicesRunning("dispenser") {
		if p := f.Services[name].Profiles; len(p) > 0 {
			t.Errorf("service %s: profiles %v, want none: dispensers start with `up`", name, p)
		}
	}
}

// TestComposeImagesPinned: every image has a version tag (never latest, never none); the
// leafbus image is built from the repository instead; the NATS servers run the
// nats-server version go.mod builds the dispenser and the tests with.
func TestComposeImagesPinned(t *testing.T) {
	f := loadCompose(t)
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod requires no github.com/nats-io/nats-server/v2")
	}
	for _, name := range f.servicesWithImage("nats") {
		if tag := strings.TrimPrefix(f.Services[name].Image, "nats:"); tag != string(m[1]) && !strings.HasPrefix(tag, string(m[1])+"-") {
			t.Errorf("service %s: image %s, want nats-server %s as go.mod (nats:%s-alpine)", name, f.Services[name].Image, m[1], m[1])
		}
	}
	version := regexp.MustCompile(`^[a-z0-9./_-]+:v?[0-9]+\.[0-9]+(\.[0-9]+)?(-[a-z0-9.]+)?$`)
	for name, s := range f.Services {
		switch {
		case s.Build != nil:
			// Built here; its tag only names the local result.
		case s.Image == "":
			t.Errorf("service %s: neither image nor build", name)
		case !version.MatchString(s.Image):
			t.Errorf("service %s: image %q is not pinned to a version (want e.g. name:1.2.3)", name, s.Image)
		}
	}
}

// TestComposeReferences: every service named in depends_on, in a URL or address of the
// dispensers and bench, and in the NATS and ZooKeeper cluster settings exists; every
// bind-mounted file exists in the repository; every named volume is declared.
func TestComposeReferences(t *testing.T) {
	f := loadCompose(t)
	for name, s := range f.Services {
		for dep, cond := range s.DependsOn {
			if _, ok := f.Services[dep]; !ok {
				t.Errorf("service %s: depends_on %q: no such service", name, dep)
				continue
			}
			if cond == "service_healthy" && f.Services[dep].Healthcheck == nil {
				t.Errorf("service %s: depends_on %s with condition service_healthy, but %s has no healthcheck", name, dep, dep)
			}
		}
		for _, v := range s.Volumes {
			src, _, ok := strings.Cut(v, ":")
			if !ok {
				t.Errorf("service %s: volume %q: want source:target", name, v)
				continue
			}
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				if _, err := os.Stat(filepath.Join("../..", src)); err != nil {
					t.Errorf("service %s: bind mount %q: %v", name, v, err)
				}
			} else if _, ok := f.Volumes[src]; !ok {
				t.Errorf("service %s: volume %q is not declared under volumes:", name, src)
			}
		}
		for network := range s.Networks {
			if _, ok := f.Networks[network]; !ok && network != "default" {
				t.Errorf("service %s: network %q is not declared under networks:", name, network)
			}
		}
	}

	// ZooKeeper: the ensemble names its members by service name, each with its own id.
	ids := map[string]string{}
	for _, name := range f.servicesWithImage("zookeeper") {
		env := f.Services[name].Environment
		if other, dup := ids[env["ZOO_MY_ID"]]; dup {
			t.Errorf("services %s and %s: both ZOO_MY_ID=%s", other, name, env["ZOO_MY_ID"])
		}
		ids[env["ZOO_MY_ID"]] = name
		members := strings.Fields(env["ZOO_SERVERS"])
		if len(members) != 3 {
			t.Errorf("service %s: ZOO_SERVERS lists %d servers, want 3", name, len(members))
		}
		for _, m := range members {
			// server.N=host:peer:election;client
			_, addr, _ := strings.Cut(m, "=")
			host, _, _ := strings.Cut(addr, ":")
			if _, ok := f.Services[host]; !ok {
				t.Errorf("service %s: ZOO_SERVERS entry %q: no service %q", name, m, host)
			}
		}
	}
}

// wantServiceHosts checks that every host:port is host of a service (or fails naming
// what).
func wantServiceHosts(t *testing.T, f *composeFile, what string, hostports []string) {
	t.Helper()
	if len(hostports) == 0 {
		t.Errorf("%s: no address", what)
	}
	for _, hp := range hostports {
		host, _, err := net.SplitHostPort(hp)
		if err != nil {
			t.Errorf("%s: %q: %v", what, hp, err)
			continue
		}
		if _, ok := f.Services[host]; !ok {
			t.Errorf("%s: host %q of %q is not a service", what, host, hp)
		}
	}
}

// natsHosts turns a comma-separated URL list into host:port pairs.
func natsHosts(t *testing.T, what, urls string) []string {
	t.Helper()
	var out []string
	for _, u := range strings.Split(urls, ",") {
		parsed, err := url.Parse(strings.TrimSpace(u))
		if err != nil || parsed.Scheme != "nats" {
			t.Errorf("%s: %q is not a nats:// URL (%v)", what, u, err)
			continue
		}
		out = append(out, parsed.Host)
	}
	return out
}

// TestComposeDispensers: each dispenser's command-line flags and LEAFBUS_* variables
// (from its environment block and the image's ENV) exist, and the whole configuration
// passes the dispenser's own parsing and validation; it is the production one (NATS
// cluster, MySQL store, ZooKeeper registry, R3); and what tells dispensers apart is
// distinct.
func TestComposeDispensers(t *testing.T) {
	f := loadCompose(t)
	flags := (&Config{}).flagSet(io.Discard)
	envFlags := map[string]string{}
	flags.VisitAll(func(fl *flag.Flag) { envFlags[envName(fl.Name)] = fl.Name })
	imageEnv := dockerfileEnv(t)
	nodeIDs, advertised := map[string]string{}, map[string]string{}

	names := f.servicesRunning("dispenser")
	if len(names) == 0 {
		t.Fatal("no dispenser service")
	}
	for _, name := range names {
		s := f.Services[name]
		for _, fl := range flagArgs(s.Command) {
			if flags.Lookup(fl) == nil {
				t.Errorf("service %s: command flag --%s: the dispenser has no such flag", name, fl)
			}
		}
		env := map[string]string{}
		for k, v := range imageEnv {
			env[k] = v
		}
		for k, v := range s.Environment {
			env[k] = v
		}
		for k := range env {
			if strings.HasPrefix(k, "LEAFBUS_") && envFlags[k] == "" {
				t.Errorf("service %s: %s names no dispenser flag", name, k)
			}
		}

		cfg := defaultConfig()
		if err := cfg.parse(s.Command, func(k string) string { return env[k] }, io.Discard); err != nil {
			t.Errorf("service %s: the dispenser rejects its configuration: %v", name, err)
			continue
		}
		// The roles' two dispenser users, their passwords in the environment.
		if cfg.Conn.User != "dispenser" || cfg.ServiceAuth.User != "dispenser-service" {
			t.Errorf("service %s: --user %q --service-user %q, want the roles' dispenser and dispenser-service", name, cfg.Conn.User, cfg.ServiceAuth.User)
		}
		for _, fl := range flagArgs(s.Command) {
			if strings.Contains(fl, "password") {
				t.Errorf("service %s: --%s on the command line: passwords go in the environment", name, fl)
			}
		}
		for _, u := range []struct{ user, password string }{{cfg.Conn.User, cfg.Conn.Password}, {cfg.ServiceAuth.User, cfg.ServiceAuth.Password}} {
			if want := natsPassword(t, f, u.user); u.password != want {
				t.Errorf("service %s: user %s's password is not the one the NATS services give it", name, u.user)
			}
		}
		if cfg.NATS == "" || cfg.SegmentStore != "mysql" || cfg.WorkerRegistry != "zk" || cfg.KVReplicas != 3 {
			t.Errorf("service %s: --nats %q --segment-store %s --worker-registry %s --kv-replicas %d; want a NATS cluster, mysql, zk and 3",
				name, cfg.NATS, cfg.SegmentStore, cfg.WorkerRegistry, cfg.KVReplicas)
		}
		natsAddrs := natsHosts(t, name+" --nats", cfg.NATS)
		if len(natsAddrs) != 3 {
			t.Errorf("service %s: --nats lists %d servers, want all 3 (any one may be down at start)", name, len(natsAddrs))
		}
		wantServiceHosts(t, f, name+" --nats", natsAddrs)
		zkAddrs := strings.Split(cfg.ZK, ",")
		if len(zkAddrs) != 3 {
			t.Errorf("service %s: --zk lists %d servers, want all 3", name, len(zkAddrs))
		}
		wantServiceHosts(t, f, name+" --zk", zkAddrs)
		dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
		if err != nil {
			t.Errorf("service %s: --mysql-dsn: %v", name, err)
		} else {
			wantServiceHosts(t, f, name+" --mysql-dsn", []string{dsn.Addr})
			checkDSNAgainstMySQL(t, f, name, dsn)
		}
		for _, repo := range []string{"nats", "mysql", "zookeeper"} {
			for _, dep := range f.servicesWithImage(repo) {
				if _, ok := s.DependsOn[dep]; !ok {
					t.Errorf("service %s: no depends_on %s: it would start before the server it needs", name, dep)
				}
			}
		}
		if host, _, err := net.SplitHostPort(cfg.HTTP); err != nil || host != "0.0.0.0" || !cfg.HTTPExplicit {
			t.Errorf("service %s: --http %q (explicit %v): want an explicit 0.0.0.0:port, so Prometheus on the compose network can scrape it", name, cfg.HTTP, cfg.HTTPExplicit)
		}

		if other, dup := nodeIDs[cfg.NodeID]; dup {
			t.Errorf("services %s and %s: both --node-id %s", other, name, cfg.NodeID)
		}
		nodeIDs[cfg.NodeID] = name
		if other, dup := advertised[cfg.Advertise]; dup {
			t.Errorf("services %s and %s: both --advertise %s (their worker IDs would collide in ZooKeeper)", other, name, cfg.Advertise)
		}
		advertised[cfg.Advertise] = name
		// The advertised IP is the container's fixed address, so a recreated
		// container keeps its ZooKeeper identity.
		host, _, _ := net.SplitHostPort(cfg.Advertise)
		if ip := s.Networks["default"].IPv4Address; host != ip {
			t.Errorf("service %s: --advertise %s but its fixed address is %q", name, cfg.Advertise, ip)
		}
	}
}

// natsPassword is the password the NATS services give user (deploy/nats-roles.conf
// reads it from NATS_<USER>_PASSWORD), "" when they do not agree on one.
func natsPassword(t *testing.T, f *composeFile, user string) string {
	t.Helper()
	v := "NATS_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
	pw := ""
	for i, name := range f.servicesWithImage("nats") {
		got := f.Services[name].Environment[v]
		if i > 0 && got != pw {
			return ""
		}
		pw = got
	}
	return pw
}

// checkDSNAgainstMySQL: the DSN's user, password and database are the ones the mysql
// service creates.
func checkDSNAgainstMySQL(t *testing.T, f *composeFile, service string, dsn *mysql.Config) {
	t.Helper()
	host, _, _ := net.SplitHostPort(dsn.Addr)
	env := f.Services[host].Environment
	if dsn.User != env["MYSQL_USER"] || dsn.Passwd != env["MYSQL_PASSWORD"] || dsn.DBName != env["MYSQL_DATABASE"] {
		t.Errorf("service %s: --mysql-dsn user %q password %q database %q; service %s creates MYSQL_USER %q MYSQL_PASSWORD %q MYSQL_DATABASE %q",
			service, dsn.User, dsn.Passwd, dsn.DBName, host, env["MYSQL_USER"], env["MYSQL_PASSWORD"], env["MYSQL_DATABASE"])
	}
}

// TestComposeBench: bench's flags exist in cmd/bench, its servers are services, and the
// tags it loads exist in the MySQL init script.
func TestComposeBench(t *testing.T) {
	f := loadCompose(t)
	flags := benchFlags(t)
	initSQL, err := os.ReadFile(filepath.Join(deployDir, "mysql-init.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range f.servicesRunning("bench") {
		s := f.Services[name]
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		values := map[string]*string{}
		for fl, isBool := range flags {
			v := ""
			values[fl] = &v
			set := func(s string) error { v = s; return nil }
			if isBool {
				fs.BoolFunc(fl, "", set) // --check parses without a value
			} else {
				fs.Func(fl, "", set)
			}
		}
		for _, fl := range flagArgs(s.Command) {
			if _, ok := flags[fl]; !ok {
				t.Errorf("service %s: command flag --%s: bench has no such flag", name, fl)
			}
		}
		if err := fs.Parse(s.Command); err != nil {
			t.Errorf("service %s: command %q: %v", name, s.Command, err)
			continue
		}
		wantServiceHosts(t, f, name+" --nats", natsHosts(t, name+" --nats", *values["nats"]))
		// An application's user of the roles, with its own inbox prefix, and its
		// password from a variable bench reads.
		if user, inbox := *values["user"], *values["inbox-prefix"]; user == "" || inbox != "_INBOX_"+user {
			t.Errorf("service %s: --user %q --inbox-prefix %q: want an application's user of deploy/nats-roles.conf with its inbox prefix _INBOX_<user>", name, user, inbox)
		}
		env := benchEnv(t)
		for k := range s.Environment {
			if strings.HasPrefix(k, "LEAFBUS_") && !env[k] {
				t.Errorf("service %s: bench reads no %s (it reads %v)", name, k, slices.Sorted(maps.Keys(env)))
			}
		}
		if s.Environment["LEAFBUS_PASSWORD"] == "" {
			t.Errorf("service %s: no LEAFBUS_PASSWORD: the user's password must come from the environment", name)
		}
		if k := *values["kind"]; k != "" && k != "segment" && k != "snowflake" {
			t.Errorf("service %s: --kind %q: want segment or snowflake", name, k)
		}
		if *values["kind"] != "snowflake" {
			for _, tag := range strings.Split(*values["tags"], ",") {
				if !strings.Contains(string(initSQL), "'"+tag+"'") {
					t.Errorf("service %s: --tags %q: the MySQL init script does not create tag %q", name, *values["tags"], tag)
				}
			}
		}
	}
}

// benchFlags reads the flag names cmd/bench declares, each mapped to whether it is a
// boolean: calls such as fs.StringVar(&v, "name", ...) and fs.Bool("name", ...) in its
// non-test files, plus the connection flags when it calls ConnConfig.RegisterFlags.
// bench is another main package, so reading its source is the way to follow its real
// flags.
func benchFlags(tb testing.TB) map[string]bool {
	tb.Helper()
	nameArg := map[string]int{ // flag.FlagSet method -> index of the name argument
		"Bool": 0, "Int": 0, "Int64": 0, "Uint": 0, "Uint64": 0, "String": 0, "Float64": 0, "Duration": 0, "Func": 0, "BoolFunc": 0,
		"BoolVar": 1, "IntVar": 1, "Int64Var": 1, "UintVar": 1, "Uint64Var": 1, "StringVar": 1, "Float64Var": 1, "DurationVar": 1, "TextVar": 1, "Var": 1,
	}
	minArgs := func(method string) int {
		switch {
		case method == "Var":
			return 3
		case strings.HasSuffix(method, "Var"):
			return 4
		}
		return 3
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(benchDir, "*.go"))
	if err != nil {
		tb.Fatal(err)
	}
	flags := map[string]bool{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if sel.Sel.Name == "RegisterFlags" {
				conn := flag.NewFlagSet("conn", flag.ContinueOnError)
				(&client.ConnConfig{}).RegisterFlags(conn)
				conn.VisitAll(func(f *flag.Flag) { flags[f.Name] = false })
				return true
			}
			i, ok := nameArg[sel.Sel.Name]
			if !ok || len(call.Args) < minArgs(sel.Sel.Name) {
				return true
			}
			if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if name, err := strconv.Unquote(lit.Value); err == nil {
					flags[name] = strings.HasPrefix(sel.Sel.Name, "Bool")
				}
			}
			return true
		})
	}
	// A sanity floor, so that a change in how bench declares flags fails here instead
	// of letting every flag through as "unknown".
	for _, want := range []string{"nats", "kind", "tags", "duration", "check", "user", "creds"} {
		if _, ok := flags[want]; !ok {
			tb.Fatalf("reading %s: flag --%s not found among %d flags; has the way bench declares flags changed?", benchDir, want, len(flags))
		}
	}
	return flags
}

// benchEnv reads the LEAFBUS_ variables bench reads: the names of its envFlags, from
// its source as benchFlags reads its flags.
func benchEnv(tb testing.TB) map[string]bool {
	tb.Helper()
	src := readFile(tb, filepath.Join(benchDir, "config.go"))
	m := regexp.MustCompile(`(?s)var envFlags = \[\]string\{([^}]*)\}`).FindStringSubmatch(src)
	if m == nil {
		tb.Fatalf("%s/config.go: no envFlags list; has the way bench reads its environment changed?", benchDir)
	}
	env := map[string]bool{}
	for _, q := range regexp.MustCompile(`"[^"]+"`).FindAllString(m[1], -1) {
		name, _ := strconv.Unquote(q)
		env[envName(name)] = true
	}
	return env
}

// readFile is a file's text, or fails tb.
func readFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// TestComposeNATSConfig loads deploy/nats.conf with nats-server's own parser, once per
// NATS service with that service's environment: JetStream on, a cluster whose routes
// are the NATS services and authenticate, a distinct server name each, the roles of
// deploy/nats-roles.conf mounted where the include finds them, and the healthcheck on
// the monitoring port.
func TestComposeNATSConfig(t *testing.T) {
	f := loadCompose(t)
	names := f.servicesWithImage("nats")
	serverNames := map[string]string{}
	for _, name := range names {
		s := f.Services[name]
		conf, confDst := "", ""
		mounts := map[string]string{} // target -> source
		for _, v := range s.Volumes {
			src, dst, _ := strings.Cut(v, ":")
			dst, _, _ = strings.Cut(dst, ":")
			mounts[dst] = src
			if slices.Contains(s.Command, dst) {
				conf, confDst = filepath.Join("../..", src), dst
			}
		}
		if conf == "" {
			t.Errorf("service %s: command %q names no mounted config file", name, s.Command)
			continue
		}
		// The include names a file beside the configuration: it must be mounted there.
		includes := regexp.MustCompile(`(?m)^\s*include\s+(\S+)`).FindAllStringSubmatch(readFile(t, conf), -1)
		for _, inc := range includes {
			dst := filepath.Join(filepath.Dir(confDst), inc[1])
			if src := mounts[dst]; filepath.Clean(filepath.Join("../..", src)) != filepath.Clean(filepath.Join(filepath.Dir(conf), inc[1])) {
				t.Errorf("service %s: %s includes %s, but %s mounts %q there", name, conf, inc[1], dst, src)
			}
		}
		for k, v := range s.Environment {
			t.Setenv(k, v)
		}
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Errorf("service %s: %s: %v", name, conf, err)
			continue
		}
		if !opts.JetStream || opts.Cluster.Name == "" || opts.Cluster.Port == 0 {
			t.Errorf("service %s: JetStream %v, cluster name %q, cluster port %d; want JetStream in a named cluster", name, opts.JetStream, opts.Cluster.Name, opts.Cluster.Port)
		}
		if opts.ServerName == "" || strings.HasPrefix(opts.ServerName, "$") {
			t.Errorf("service %s: server_name %q: want it from the environment", name, opts.ServerName)
		}
		if other, dup := serverNames[opts.ServerName]; dup {
			t.Errorf("services %s and %s: both server_name %q (JetStream needs them distinct)", other, name, opts.ServerName)
		}
		serverNames[opts.ServerName] = name
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Host)
			if r.Port() != strconv.Itoa(opts.Cluster.Port) {
				t.Errorf("service %s: route %s: port %s, want the cluster port %d", name, r, r.Port(), opts.Cluster.Port)
			}
		}
		if len(routes) != len(names) {
			t.Errorf("service %s: %d routes %v, want one per NATS service (%d)", name, len(routes), routes, len(names))
		}
		for _, r := range opts.Routes {
			if pw, _ := r.User.Password(); opts.Cluster.Password == "" || r.User.Username() != opts.Cluster.Username || pw != opts.Cluster.Password {
				t.Errorf("service %s: route %s does not authenticate as the cluster's route user", name, r.Redacted())
			}
		}
		if len(opts.Users) != 6 {
			t.Errorf("service %s: %d users, want the 6 roles of deploy/nats-roles.conf", name, len(opts.Users))
		}
		wantServiceHosts(t, f, name+" routes", routes)
		if opts.Port != 4222 {
			t.Errorf("service %s: client port %d, want 4222 (the dispensers' --nats URLs use it)", name, opts.Port)
		}
		if hc := s.Healthcheck; hc == nil || !strings.Contains(strings.Join(hc.Test, " "), fmt.Sprintf(":%d/healthz", opts.HTTPPort)) {
			t.Errorf("service %s: want a healthcheck on /healthz of the monitoring port %d", name, opts.HTTPPort)
		}
	}
}

// TestComposeMySQLInit: the init script creates leaf_alloc exactly as the MySQL store
// knows it (segment.MySQLSchema, PROTOCOL.md's DDL; the script leaves out IF NOT EXISTS,
// as it only runs on an empty database) and inserts Leaf's sample row (tag
// leaf-segment-test, max_id 1, step 2000).
func TestComposeMySQLInit(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "mysql-init.sql"))
	if err != nil {
		t.Fatal(err)
	}
	create := regexp.MustCompile(`(?is)CREATE\s+TABLE\s[^;]*;`).FindString(string(b))
	normalize := func(s string) string {
		s = strings.Replace(s, "IF NOT EXISTS ", "", 1)
		return strings.Join(strings.Fields(s), " ")
	}
	if got, want := normalize(create), normalize(segment.MySQLSchema); got != want {
		t.Errorf("mysql-init.sql CREATE TABLE:\n%s\nwant (segment.MySQLSchema without IF NOT EXISTS):\n%s", got, want)
	}
	insert := regexp.MustCompile(`(?is)INSERT\s+INTO\s+` + "`?leaf_alloc`?" + `\s*\(([^)]*)\)\s*VALUES\s*\(([^)]*)\)`)
	m := insert.FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("mysql-init.sql: no INSERT INTO leaf_alloc (...) VALUES (...)")
	}
	cols, vals := splitSQLList(m[1]), splitSQLList(m[2])
	row := map[string]string{}
	for i := range min(len(cols), len(vals)) {
		row[strings.Trim(cols[i], "`")] = vals[i]
	}
	for col, want := range map[string]string{"biz_tag": "'" + dispenser.SampleTagName + "'", "max_id": "1", "step": strconv.Itoa(dispenser.SampleTagStep)} {
		if row[col] != want {
			t.Errorf("mysql-init.sql: sample row %s = %s, want %s", col, row[col], want)
		}
	}
}

// TestComposeMySQLInitGrants runs the init script as the mysql image does, on a real
// server: after the image has made MYSQL_USER the owner of MYSQL_DATABASE, in that
// database. The user ends with what a dispenser needs (README "MySQL segments"): it
// serves and adds tags, and may do nothing else.
func TestComposeMySQLInitGrants(t *testing.T) {
	f := loadCompose(t)
	env := f.Services["mysql"].Environment
	dbName, user, pw := env["MYSQL_DATABASE"], env["MYSQL_USER"], env["MYSQL_PASSWORD"]
	srv := testenv.StartMariaDB(t)
	ctx := testutil.Context(t, time.Minute)
	root := testenv.OpenDB(t, srv.DSN(""))
	for _, stmt := range []string{ // what the image's entrypoint does before the init scripts
		"CREATE DATABASE `" + dbName + "`",
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY '" + pw + "'",
		"GRANT ALL ON `" + dbName + "`.* TO '" + user + "'@'%'",
	} {
		if _, err := root.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	rootDB := testenv.OpenDB(t, srv.DSN(dbName))
	script := regexp.MustCompile(`(?m)^--.*$`).ReplaceAllString(readFile(t, filepath.Join(deployDir, "mysql-init.sql")), "")
	for _, stmt := range strings.Split(script, ";") {
		if stmt = strings.TrimSpace(stmt); stmt == "" {
			continue
		}
		if _, err := rootDB.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("mysql-init.sql: %s: %v", stmt, err)
		}
	}

	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = user, pw, "tcp", srv.Addr(), dbName
	store, err := segment.OpenMySQLStore(ctx, segment.MySQLConfig{DSN: cfg.FormatDSN()})
	if err != nil {
		t.Fatalf("the dispensers' user after mysql-init.sql: %v", err)
	}
	defer store.Close()
	if _, err := store.Take(ctx, dispenser.SampleTagName, 0); err != nil {
		t.Errorf("take a segment as %s: %v", user, err)
	}
	if _, err := store.AddTag(ctx, segment.Tag{Name: "orders", Step: 1000}); err != nil {
		t.Errorf("add a tag as %s: %v", user, err)
	}
	leaf := testenv.OpenDB(t, cfg.FormatDSN())
	for _, stmt := range []string{"DELETE FROM leaf_alloc", "DROP TABLE leaf_alloc", "CREATE TABLE other (id int)"} {
		if _, err := leaf.ExecContext(ctx, stmt); err == nil {
			t.Errorf("%s as %s succeeded: the user keeps more than a dispenser needs", stmt, user)
		}
	}
}

func splitSQLList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out
}

// TestDockerfile: a multi-stage build of both binaries, static (CGO off), base images
// pinned, and a non-root user in the image that runs.
func TestDockerfile(t *testing.T) {
	lines := dockerfileInstructions(t)
	var froms []string
	var builds, user, entrypoint string
	cgoOff := false
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			froms = append(froms, strings.Fields(rest)[0])
			user = "" // USER applies per stage
		case "RUN":
			builds += " " + rest
		case "ENV":
			cgoOff = cgoOff || strings.Contains(rest, "CGO_ENABLED=0")
		case "USER":
			user = rest
		case "ENTRYPOINT":
			entrypoint = rest
		}
	}
	if len(froms) < 2 {
		t.Errorf("FROM %v: want a multi-stage build", froms)
	}
	pinned := regexp.MustCompile(`^[a-z0-9./_-]+:v?[0-9]+\.[0-9]+`)
	for _, img := range froms {
		if img != "scratch" && !pinned.MatchString(img) {
			t.Errorf("FROM %s: not pinned to a version", img)
		}
	}
	for _, cmd := range []string{"./cmd/dispenser", "./cmd/bench"} {
		if !strings.Contains(builds, cmd) {
			t.Errorf("no RUN builds %s", cmd)
		}
	}
	if !cgoOff && !strings.Contains(builds, "CGO_ENABLED=0") {
		t.Error("CGO_ENABLED=0 not set: the binary would not be static")
	}
	if uid, _, _ := strings.Cut(user, ":"); user == "" || uid == "0" || uid == "root" {
		t.Errorf("final stage USER %q: want a non-root user", user)
	}
	if !strings.Contains(entrypoint, "dispenser") {
		t.Errorf("ENTRYPOINT %s: want the dispenser (compose's dispensers rely on it)", entrypoint)
	}
}

// dockerfileInstructions returns the Dockerfile's instructions, comments dropped and
// continued lines joined.
func dockerfileInstructions(tb testing.TB) []string {
	tb.Helper()
	b, err := os.ReadFile(dockerfilePath)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur == "") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		cur += line
		if cur != "" {
			out = append(out, cur)
		}
		cur = ""
	}
	return out
}

// dockerfileEnv returns the image's ENV NAME=value settings (of the last stage: the
// one that runs).
func dockerfileEnv(tb testing.TB) map[string]string {
	tb.Helper()
	env := map[string]string{}
	for _, l := range dockerfileInstructions(tb) {
		instr, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			env = map[string]string{}
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				if k, v, ok := strings.Cut(kv, "="); ok {
					env[k] = v
				}
			}
		}
	}
	return env
}
