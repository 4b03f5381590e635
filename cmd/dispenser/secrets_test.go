package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// secretMark is in every hostile password of TestSecretsNeverShown, around the hostile
// characters: a password shown whole or in part (up to one of them) shows it.
const secretMark = "zq8K"

// hostilePasswords holds each character that breaks a URL, a DSN or a JDBC URL when it
// is in a password, alone and together.
func hostilePasswords() []string {
	var pws []string
	for _, c := range []string{"%", "@", "/", ":", "?", "#", "&", "=", ",", " ", `\`, "%zz", "%41"} {
		pws = append(pws, secretMark+c+secretMark)
	}
	return append(pws,
		secretMark+"Sup3r/S3cret",
		secretMark+"p%w0rd X@,/:?#&= \\"+secretMark,
		secretMark+"?user=x&password=y#"+secretMark,
		secretMark+"@tcp(evil:1)/db?"+secretMark,
	)
}

// propsEscape writes s as a .properties value.
func propsEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "#", `\#`, "!", `\!`).Replace(s)
}

// TestSecretsNeverShown: a password of any characters, given through any input that
// takes one, appears in none of --print-config's output, the errors and the log lines of
// a start that fails to connect. So do tokens, NKey and .creds seeds and the ID key.
// Every start joins a closed port with --start-timeout 0, so it fails at once.
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	closedPort := freePort(t)
	closed := fmt.Sprintf("127.0.0.1:%d", closedPort)
	dir := t.TempDir()
	type input struct {
		name   string
		args   []string
		env    map[string]string
		secret string
	}
	var inputs []input
	natsArgs := []string{"--nats", "nats://" + closed}
	mysqlArgs := func(dsn string) []string {
		return []string{"--segment-store", "mysql", "--mysql-dsn", dsn, "--listen", "127.0.0.1:0"}
	}
	leafProps := func(body string) []string {
		path := writeFile(t, "leaf.properties", "leaf.snowflake.enable=false\n"+body)
		return []string{"--leaf-properties", path, "--listen", "127.0.0.1:0"}
	}
	for i, pw := range hostilePasswords() {
		at := func(name string) string { return fmt.Sprintf("%s/%d", name, i) }
		enc := url.UserPassword("bob", pw).String()
		inputs = append(inputs,
			input{at("NATSURL"), []string{"--nats", "nats://bob:" + pw + "@" + closed}, nil, pw},
			input{at("NATSURLNoScheme"), []string{"--nats", "bob:" + pw + "@" + closed}, nil, pw},
			input{at("NATSURLEncoded"), []string{"--nats", "nats://" + enc + "@" + closed}, nil, pw},
			input{at("NATSURLSecond"), []string{"--nats", "nats://" + closed + ",nats://bob:" + pw + "@" + closed}, nil, pw},
			input{at("NATSURLToken"), []string{"--nats", "nats://" + pw + "@" + closed}, nil, pw},
			input{at("NATSURLEnv"), nil, map[string]string{"LEAFBUS_NATS": "nats://bob:" + pw + "@" + closed}, pw},
			input{at("Password"), append([]string{"--user", "bob", "--password", pw}, natsArgs...), nil, pw},
			input{at("PasswordEnv"), natsArgs, map[string]string{"LEAFBUS_USER": "bob", "LEAFBUS_PASSWORD": pw}, pw},
			input{at("Token"), append([]string{"--token", pw}, natsArgs...), nil, pw},
			input{at("TokenEnv"), natsArgs, map[string]string{"LEAFBUS_TOKEN": pw}, pw},
			input{at("ServicePassword"), append([]string{"--service-user", "svc", "--service-password", pw}, natsArgs...), nil, pw},
			input{at("ServiceTokenEnv"), natsArgs, map[string]string{"LEAFBUS_SERVICE_TOKEN": pw}, pw},
			input{at("MySQLDSN"), mysqlArgs("leaf:" + pw + "@tcp(" + closed + ")/leaf"), nil, pw},
			input{at("MySQLDSNEnv"), []string{"--segment-store", "mysql", "--listen", "127.0.0.1:0"},
				map[string]string{"LEAFBUS_MYSQL_DSN": "leaf:" + pw + "@tcp(" + closed + ")/leaf"}, pw},
			input{at("JDBCURLUserInfo"), leafProps("leaf.jdbc.url=" + propsEscape("jdbc:mysql://leafuser:"+pw+"@"+closed+"/leaf") + "\n"), nil, pw},
			input{at("JDBCURLParams"), leafProps("leaf.jdbc.url=" + propsEscape("jdbc:mysql://"+closed+"/leaf?user=leaf&password="+pw) + "\n"), nil, pw},
			input{at("JDBCURLParamsEncoded"), leafProps("leaf.jdbc.url=" + propsEscape("jdbc:mysql://"+closed+"/leaf?user=leaf&password="+url.QueryEscape(pw)) + "\n"), nil, pw},
			input{at("JDBCPassword"), leafProps("leaf.jdbc.url=jdbc:mysql://" + closed + "/leaf\nleaf.jdbc.username=leaf\nleaf.jdbc.password=" + propsEscape(pw) + "\n"), nil, pw},
			input{at("NATSURLInConfig"), []string{"--config", writeFile(t, "c.yaml", "nats: "+fmt.Sprintf("%q", "nats://bob:"+pw+"@"+closed)+"\n")}, nil, pw},
		)
	}
	nkey, seed := testutil.NKeySeedFile(t, dir)
	creds, credsSeed := testutil.CredsFile(t, t.TempDir())
	const key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	keyFile := writeFile(t, "id.key", key+"\n")
	inputs = append(inputs,
		input{"NKey", append([]string{"--nkey", nkey}, natsArgs...), nil, seed},
		input{"Creds", append([]string{"--creds", creds}, natsArgs...), nil, credsSeed},
		input{"IDKeyFile", append([]string{"--id-key-file", keyFile}, natsArgs...), nil, key},
		input{"IDKeyEnv", natsArgs, map[string]string{"LEAFBUS_ID_KEY": key}, key},
	)
	// A start that retries for a second logs each failed attempt.
	all := hostilePasswords()[14]
	inputs = append(inputs,
		input{"RetriesNATSURLEncoded", []string{"--start-timeout", "1s", "--nats", "nats://" + strings.ReplaceAll(url.UserPassword("bob", all).String(), ",", "%2C") + "@" + closed}, nil, all},
		input{"RetriesPassword", []string{"--start-timeout", "1s", "--user", "bob", "--password", all, "--nats", "nats://" + closed}, nil, all},
		input{"RetriesMySQLDSN", append([]string{"--start-timeout", "1s"}, mysqlArgs("leaf:"+all+"@tcp("+closed+")/leaf")...), nil, all},
	)
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			t.Parallel()
			check := func(what, out string) {
				t.Helper()
				for _, s := range []string{in.secret, secretMark, url.QueryEscape(in.secret), url.PathEscape(in.secret)} {
					if s != "" && strings.Contains(out, s) {
						t.Errorf("%s shows the secret (%q):\n%s", what, s, out)
						return
					}
				}
			}
			getenv := func(k string) string { return in.env[k] }
			var out bytes.Buffer
			runServe(context.Background(), append([]string{"--print-config"}, in.args...), getenv, &out, &out)
			check("--print-config", out.String())

			out.Reset()
			args := append([]string{"--data-dir", t.TempDir(), "--node-id", "secrets", "--http", "", "--start-timeout", "0"}, in.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code := runServe(ctx, args, getenv, &out, &out)
			if code == 0 {
				t.Fatalf("a start against a closed port succeeded:\n%s", out.String())
			}
			check("a failed start (its log and error)", out.String())
			if strings.HasPrefix(in.name, "Retries") && !strings.Contains(out.String(), "attempt=2") {
				t.Errorf("no second attempt logged:\n%s", out.String())
			}
		})
	}
}
