package main

import (
	"bufio"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/leafbus/leafbus/dispenser"
)

const (
	systemdUnitPath = deployDir + "/systemd/leafbus-dispenser.service"
	systemdEnvPath  = deployDir + "/systemd/dispenser.env.example"
)

// unitFile is a systemd unit: section -> key -> its values in order (a key may repeat).
type unitFile map[string]map[string][]string

// readUnit parses a unit file as systemd does for what these checks read: comments,
// sections, key=value, and lines continued with a backslash.
func readUnit(tb testing.TB, path string) unitFile {
	tb.Helper()
	u := unitFile{}
	section, cont := "", ""
	sc := bufio.NewScanner(strings.NewReader(readFile(tb, path)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cont == "" && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, cont = cont+line, ""
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			tb.Fatalf("%s: line %q: want key=value inside a section", path, line)
		}
		k = strings.TrimSpace(k)
		u[section][k] = append(u[section][k], strings.TrimSpace(v))
	}
	return u
}

// get is the last value of a key ("" when unset), as systemd takes a repeated setting.
func (u unitFile) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// TestSystemdUnit: deploy/systemd/leafbus-dispenser.service passes `systemd-analyze
// verify` without a word (with the built dispenser where its ExecStart names the binary,
// which verify wants to exist) and scores "OK" in `systemd-analyze security`; every flag in its ExecStart is one of dispenser --help
// (the check compose's dispensers get); it runs as a dedicated user with its data dir in
// StateDirectory, hardened, restarted on failure, with the secrets in an EnvironmentFile
// whose example names only real LEAFBUS_ variables.
func TestSystemdUnit(t *testing.T) {
	u := readUnit(t, systemdUnitPath)
	svc := "Service"
	exec0 := strings.Fields(u.get(svc, "ExecStart"))
	if len(exec0) == 0 || filepath.Base(exec0[0]) != "dispenser" {
		t.Fatalf("ExecStart %q: want the dispenser", u.get(svc, "ExecStart"))
	}
	flags := (&Config{}).flagSet(io.Discard)
	args := map[string]string{}
	for _, a := range exec0[1:] {
		if !strings.HasPrefix(a, "-") {
			t.Errorf("ExecStart argument %q: want --flag=value (one word each)", a)
		}
	}
	for _, name := range flagArgs(exec0[1:]) {
		if flags.Lookup(name) == nil {
			t.Errorf("ExecStart flag --%s: the dispenser has no such flag", name)
		}
	}
	for _, a := range exec0[1:] {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		args[name] = value
		for _, secret := range []string{"password", "service-password", "token", "service-token", "mysql-dsn"} {
			if name == secret {
				t.Errorf("ExecStart --%s: a secret on the command line (ps shows it); put %s in the EnvironmentFile", name, envName(name))
			}
		}
	}

	for _, c := range []struct{ key, want string }{
		// The dispenser does not speak sd_notify: Type=notify would never see it start.
		{"Type", "simple"},
		{"Restart", "on-failure"},
		{"NoNewPrivileges", "yes"},
		{"ProtectSystem", "strict"},
		{"ProtectHome", "yes"},
		{"PrivateTmp", "yes"},
		{"PrivateDevices", "yes"},
		{"KillSignal", "SIGTERM"},
	} {
		if got := u.get(svc, c.key); got != c.want {
			t.Errorf("[Service] %s=%q, want %q", c.key, got, c.want)
		}
	}
	if user := u.get(svc, "User"); user == "" || user == "root" || user == "0" {
		t.Errorf("[Service] User=%q: want a dedicated user", user)
	}
	if state := u.get(svc, "StateDirectory"); state == "" || args["data-dir"] != "/var/lib/"+state {
		t.Errorf("StateDirectory=%q, --data-dir=%q: want the data dir in the StateDirectory (/var/lib/<name>), which ProtectSystem=strict leaves writable", state, args["data-dir"])
	}
	if u.get(svc, "EnvironmentFile") == "" {
		t.Error("no EnvironmentFile: the NATS passwords and the ID key need one")
	}

	// The example EnvironmentFile names LEAFBUS_ variables the dispenser reads.
	known := map[string]bool{dispenser.IDKeyEnv: true}
	(&Config{}).flagSet(io.Discard).VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	vars := regexp.MustCompile(`(?m)^#?(LEAFBUS_[A-Z0-9_]+)=`).FindAllStringSubmatch(readFile(t, systemdEnvPath), -1)
	if len(vars) == 0 {
		t.Errorf("%s sets no LEAFBUS_ variable", systemdEnvPath)
	}
	for _, m := range vars {
		if !known[m[1]] {
			t.Errorf("%s: %s is no flag's environment variable (nor %s)", systemdEnvPath, m[1], dispenser.IDKeyEnv)
		}
	}

	// systemd's own check. verify wants ExecStart's binary to exist: the copy names the
	// dispenser this test built, and nothing else changes.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze not found (Debian package systemd): run make deps")
	}
	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	unit := readFile(t, systemdUnitPath)
	copyPath := filepath.Join(t.TempDir(), filepath.Base(systemdUnitPath))
	if err := os.WriteFile(copyPath, []byte(strings.Replace(unit, "ExecStart="+exec0[0], "ExecStart="+bin, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", systemdUnitPath, err, out)
	}
	// And its own measure of the hardening: an overall exposure of at most 2.0 ("OK";
	// the file scores 1.4), so that a hardening line dropped shows here.
	if out, err := exec.Command(analyze, "security", "--offline=true", "--threshold=20", copyPath).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security %s: exposure above 2.0 (%v):\n%s", systemdUnitPath, err, out)
	}
}
