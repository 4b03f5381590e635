import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.springframework.http.converter.HttpMessageNotReadableException;
import org.springframework.web.client.RestTemplate;

/**
 * The calls a Java service makes to Leaf's HTTP API, with the stack Leaf's own server
 * runs on (Spring Web 4.3's RestTemplate and Jackson 2), against a dispenser that took
 * over Leaf's table. Run by cmd/dispenser's TestJavaLeafClient, which compiles it with
 * javac, starts the real dispenser on rows it inserted by plain SQL, and passes:
 *
 *   args[0]  the base URL (http://127.0.0.1:port)
 *   args[1]  the snowflake worker ID the dispenser must issue with
 *
 * Each check prints "ok <name>" or "FAIL <name>: <why>"; the exit status is the number of
 * failures. Tags are written with Unicode escapes so that the source and the command
 * line stay ASCII whatever the JVM's default charset.
 */
public class LeafClientCalls {
    static int failures = 0;
    static final RestTemplate rest = new RestTemplate();

    interface Check {
        void run() throws Exception;
    }

    static void check(String name, Check c) {
        try {
            c.run();
            System.out.println("ok " + name);
        } catch (Throwable t) {
            failures++;
            System.out.println("FAIL " + name + ": " + t);
        }
    }

    static void expect(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    public static void main(String[] args) {
        String base = args[0];
        long worker = Long.parseLong(args[1]);
        // The rows TestJavaLeafClient inserted, with their max_id: the first ID each serves.
        Map<String, Long> rows = new LinkedHashMap<>();
        rows.put("leaf-segment-test", 1L);
        rows.put("com.acme.order", 1001L);
        rows.put("order:create", 2001L);
        rows.put("order create", 3001L);
        rows.put("\u8ba2\u5355", 4001L); // 订单

        // The usual client: getForObject(url, String.class), then Long.parseLong. RestTemplate
        // sends "Accept: text/plain, application/json, application/*+json, */*" and expands
        // {key} percent-encoded (a space as %20, Chinese as UTF-8). A dotted key needs the
        // trailing slash against Leaf too: Spring cuts a path variable at its last dot.
        String segment = base + "/api/segment/get/{key}/";
        for (Map.Entry<String, Long> row : rows.entrySet()) {
            String tag = row.getKey();
            long first = row.getValue();
            check("String/" + tag, () -> {
                long id = Long.parseLong(rest.getForObject(segment, String.class, tag));
                expect(id == first, "first ID " + id + ", want " + first);
            });
            // getForObject(url, Long.class) sends "Accept: application/json, application/*+json":
            // Leaf answers the digits as application/json, which Jackson reads as a Long.
            check("Long/" + tag, () -> {
                Long id = rest.getForObject(segment, Long.class, tag);
                expect(id != null && id == first + 1, "second ID " + id + ", want " + (first + 1));
            });
            check("POST/" + tag, () -> {
                long id = Long.parseLong(rest.postForObject(segment, null, String.class, tag));
                expect(id == first + 2, "third ID " + id + ", want " + (first + 2));
            });
        }
        check("NoTrailingSlash/undotted", () -> {
            long id = Long.parseLong(rest.getForObject(base + "/api/segment/get/{key}", String.class, "leaf-segment-test"));
            expect(id == 4, "ID " + id + ", want 4");
        });
        check("Suffix.json/Long", () -> {
            Long id = rest.getForObject(base + "/api/segment/get/leaf-segment-test.json", Long.class);
            expect(id != null && id == 5, "ID " + id + ", want 5");
        });
        check("UnknownTag/404", () -> {
            try {
                rest.getForObject(segment, String.class, "no such tag");
                throw new AssertionError("no error");
            } catch (org.springframework.web.client.HttpClientErrorException e) {
                expect(e.getRawStatusCode() == 404, "status " + e.getRawStatusCode() + ", want 404");
            }
        });

        // Snowflake: the key is ignored, whatever it holds. Snowflake IDs have 19 digits,
        // which Debian's jackson-core 2.14.1 refuses to read as a Long, so they are read as
        // text (what Leaf's clients do with getForObject(url, String.class) anyway).
        List<Long> snowflakes = new ArrayList<>();
        for (String key : new String[] {"orders", "biz:order", "com.acme.order", "any key", "\u8ba2\u5355"}) {
            check("Snowflake/" + key, () -> {
                long id = Long.parseLong(rest.getForObject(base + "/api/snowflake/get/{key}", String.class, key));
                expect(id > 0, "ID " + id);
                expect((id >> 12 & 1023) == worker, "worker " + (id >> 12 & 1023) + ", want " + worker);
                snowflakes.add(id);
            });
        }
        check("Snowflake/increasing", () -> {
            for (int i = 1; i < snowflakes.size(); i++) {
                expect(snowflakes.get(i) > snowflakes.get(i - 1), "IDs " + snowflakes + " do not increase");
            }
        });
        check("Snowflake/Long", () -> {
            // Recorded, not required: what Jackson makes of a 19-digit application/json body.
            try {
                Long id = rest.getForObject(base + "/api/snowflake/get/orders", Long.class);
                System.out.println("note: snowflake read as Long: " + id);
            } catch (HttpMessageNotReadableException e) {
                System.out.println("note: jackson-core refuses a 19-digit Long: " + e.getMostSpecificCause());
            }
        });

        // decodeSnowflakeId: Leaf's JSON for any value, read into a Map as Leaf's monitor does.
        check("Decode/good", () -> {
            long id = snowflakes.get(0);
            Map<?, ?> m = rest.getForObject(base + "/decodeSnowflakeId?snowflakeId={id}", Map.class, id);
            expect(String.valueOf(worker).equals(m.get("workerId")), "workerId " + m.get("workerId"));
            expect(String.valueOf(id & 4095).equals(m.get("sequenceId")), "sequenceId " + m.get("sequenceId"));
            String ts = (String) m.get("timestamp");
            long ms = (id >> 22) + 1288834974657L;
            expect(ts.startsWith(ms + "("), "timestamp " + ts + ", want it to start with " + ms);
        });
        check("Decode/POST", () -> {
            org.springframework.util.MultiValueMap<String, String> form = new org.springframework.util.LinkedMultiValueMap<>();
            form.add("snowflakeId", String.valueOf(snowflakes.get(1)));
            Map<?, ?> m = rest.postForObject(base + "/decodeSnowflakeId", form, Map.class);
            expect(String.valueOf(worker).equals(m.get("workerId")), "workerId " + m.get("workerId"));
        });
        for (String bad : new String[] {"abc", "", "1.5", "9223372036854775808"}) {
            check("Decode/bad/" + bad, () -> {
                Map<?, ?> m = rest.getForObject(base + "/decodeSnowflakeId?snowflakeId={id}", Map.class, bad);
                expect(m.size() == 1 && "snowflake Id\u53cd\u89e3\u6790\u53d1\u751f\u5f02\u5e38!".equals(m.get("errorMsg")),
                        "answer " + m);
            });
        }
        check("Decode/negative", () -> {
            Map<?, ?> m = rest.getForObject(base + "/decodeSnowflakeId?snowflakeId=-1", Map.class);
            expect("1023".equals(m.get("workerId")) && "4095".equals(m.get("sequenceId")), "answer " + m);
        });

        // The monitor pages: 200 and Leaf's tables.
        check("Cache", () -> {
            String page = rest.getForObject(base + "/cache", String.class);
            expect(page.contains("<th>name</th>") && page.contains("<th>next</th>"), "no cache table");
            for (String tag : rows.keySet()) {
                expect(page.contains("<td>" + tag + "</td>"), "no row " + tag);
            }
        });
        check("DB", () -> {
            String page = rest.getForObject(base + "/db", String.class);
            expect(page.contains("<th>tag</th>") && page.contains("<th>max</th>"), "no db table");
            for (String tag : rows.keySet()) {
                expect(page.contains("<td>" + tag + "</td>"), "no row " + tag);
            }
        });
        System.exit(failures);
    }
}
