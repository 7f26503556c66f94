// An HTTP handler for qc-worker in Java 17, JDK only: com.sun.net.httpserver, no dependencies
// (docs/handler-contract.md).
//
// Single mode (POST /messages): qc-worker POSTs each SQS message in CloudEvents binary mode: the body
// is the message body byte for byte, the metadata is in ce-* and x-sqs-* headers (percent-encoded).
// The answer decides the message's fate:
//   2xx                done: the worker deletes the message
//   400 or 422         poison: it can never succeed (the worker applies onPoison)
//   429 + Retry-After  try again later (this message), after that many seconds
//   503 + Retry-After  my dependency is down: the worker pauses receiving for that long
//   anything else      try again later, with the worker's backoff
//
// Batch mode (POST /batch, with handler.batch / --batch-max-items): one POST per batch, a JSON array
// of structured CloudEvents (content-type application/cloudevents-batch+json), each message's body
// as the event's "data". The answer is a 200 with Lambda's ReportBatchItemFailures shape,
// {"batchItemFailures": [{"itemIdentifier": "<message id>"}]}: listed items are retried (and reach
// the DLQ by the redrive policy's maxReceiveCount if they keep failing), the others deleted. There is
// no per-item poison: a non-2xx answer applies to every item, and 400/422 retries them all.
//
// The JDK has no JSON library, so a small reader (Json below) parses the events; a real service
// would use its JSON library of choice (Jackson, Gson) the same way.
//
// Orders such as {"orderId": "o-1", "amount": 12}; a body that is not JSON or has no orderId is
// poison (single: 422; batch: listed as failed); {"flaky": true} fails its first delivery (single:
// 429 with Retry-After: 1; batch: listed as failed). Each decision is printed as one JSON line.
//
// Build and run: javac -d out Handler.java && java -cp out Handler --port 8080
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;

public final class Handler {
    private static final Object OUTPUT_LOCK = new Object();

    public static void main(String[] args) throws IOException {
        int port = 8080;
        String host = "127.0.0.1";
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals("--port")) port = Integer.parseInt(args[i + 1]);
            if (args[i].equals("--host")) host = args[i + 1];
        }
        // The JDK server closes idle keep-alive connections after sun.net.httpserver.idleInterval
        // (30 s by default); the worker closes its own after 4 s idle first.
        HttpServer server = HttpServer.create(new InetSocketAddress(host, port), 128);
        server.createContext("/messages", Handler::single);
        server.createContext("/batch", Handler::batch);
        server.createContext("/healthz", ex -> answer(ex, 200, null, null));
        // The worker sends up to `concurrency` requests at once: one thread each.
        server.setExecutor(Executors.newCachedThreadPool());
        server.start();
        System.out.println("{\"listening\": \"http://" + host + ":" + port + "/messages\", \"batch\": \"http://"
                + host + ":" + port + "/batch\"}");
        System.out.flush();
    }

    static void single(HttpExchange ex) throws IOException {
        try (ex) {
            if (!ex.getRequestMethod().equals("POST") || !ex.getRequestURI().getPath().equals("/messages")) {
                answer(ex, 404, null, null);
                return;
            }
            byte[] body = ex.getRequestBody().readAllBytes();
            var h = ex.getRequestHeaders();
            int receiveCount = parseInt(h.getFirst("ce-sqsreceivecount"), 1);
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("mode", "single");
            line.put("id", unescape(h.getFirst("ce-id")));
            line.put("receiveCount", receiveCount);
            line.put("source", unescape(h.getFirst("ce-source")));
            line.put("type", h.getFirst("ce-type"));
            line.put("contentType", h.getFirst("Content-Type"));
            Map<?, ?> order = order(parseOrNull(new String(body, StandardCharsets.UTF_8)));
            if (order == null) {
                record(line, "poison", null);
                answer(ex, 422, null, null); // retrying cannot fix this body: the worker applies onPoison
                return;
            }
            String orderId = (String) order.get("orderId");
            if (Boolean.TRUE.equals(order.get("flaky")) && receiveCount == 1) {
                record(line, "retry", orderId);
                // Visible again after 1 s. (A 503 with Retry-After would say the whole dependency is
                // down: the worker would pause receiving instead.)
                answer(ex, 429, "1", null);
                return;
            }
            // Real work goes here. It must be idempotent: SQS delivers at least once.
            record(line, "done", orderId);
            answer(ex, 204, null, null);
        }
    }

    static void batch(HttpExchange ex) throws IOException {
        try (ex) {
            if (!ex.getRequestMethod().equals("POST") || !ex.getRequestURI().getPath().equals("/batch")) {
                answer(ex, 404, null, null);
                return;
            }
            Object parsed = parseOrNull(new String(ex.getRequestBody().readAllBytes(), StandardCharsets.UTF_8));
            if (!(parsed instanceof List<?> events)) {
                answer(ex, 400, null, null); // not a batch: every item is retried, none dead-lettered
                return;
            }
            StringBuilder failures = new StringBuilder();
            for (Object item : events) {
                if (!(item instanceof Map<?, ?> event) || !(event.get("id") instanceof String id)) {
                    continue;
                }
                if (!handleItem(event)) {
                    if (failures.length() > 0) failures.append(',');
                    failures.append("{\"itemIdentifier\":").append(Json.quote(id)).append('}');
                }
            }
            // Written whole, with its length: an answer cut short would retry every item.
            answer(ex, 200, null, "{\"batchItemFailures\":[" + failures + "]}");
        }
    }

    /** Whether one item of a batch is done (false: list it as failed, so it is retried). */
    static boolean handleItem(Map<?, ?> event) {
        int receiveCount = event.get("sqsreceivecount") instanceof Number n ? n.intValue() : 1;
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("mode", "batch");
        line.put("id", event.get("id"));
        line.put("receiveCount", receiveCount);
        line.put("source", event.get("source"));
        line.put("type", event.get("type"));
        line.put("contentType", event.get("datacontenttype"));
        // A JSON body is embedded as JSON; text arrives as a string, which is no order.
        Map<?, ?> order = order(event.get("data"));
        if (order == null) {
            // No per-item poison in batch mode: listed every time, the redrive policy dead-letters it.
            record(line, "poison", null);
            return false;
        }
        String orderId = (String) order.get("orderId");
        if (Boolean.TRUE.equals(order.get("flaky")) && receiveCount == 1) {
            record(line, "retry", orderId);
            return false;
        }
        // Real work goes here. It must be idempotent: SQS delivers at least once.
        record(line, "done", orderId);
        return true;
    }

    /** The order, or null when the value is not an object with a string orderId (poison). */
    static Map<?, ?> order(Object value) {
        if (value instanceof Map<?, ?> m && m.get("orderId") instanceof String) return m;
        return null;
    }

    static Object parseOrNull(String text) {
        try {
            return Json.parse(text);
        } catch (IllegalArgumentException e) {
            return null;
        }
    }

    static void answer(HttpExchange ex, int status, String retryAfter, String json) throws IOException {
        if (retryAfter != null) ex.getResponseHeaders().set("Retry-After", retryAfter);
        if (json == null) {
            ex.sendResponseHeaders(status, -1); // no body
            return;
        }
        byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(bytes);
        }
    }

    static void record(Map<String, Object> line, String result, String orderId) {
        line.put("handler", "java");
        line.put("orderId", orderId);
        line.put("result", result);
        String text = Json.write(line);
        // One line at a time: the server runs requests on several threads.
        synchronized (OUTPUT_LOCK) {
            System.out.println(text);
            System.out.flush();
        }
    }

    /** A ce-* header value, percent-decoded (the CloudEvents HTTP binding encodes it). */
    static String unescape(String v) {
        if (v == null) return "";
        try {
            return URLDecoder.decode(v.replace("+", "%2B"), StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            return v;
        }
    }

    static int parseInt(String v, int fallback) {
        try {
            return v == null ? fallback : Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            return fallback;
        }
    }

    /** A minimal JSON reader and writer (objects, arrays, strings, numbers, booleans, null). */
    static final class Json {
        private final String s;
        private int at;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) {
            Json p = new Json(text);
            p.space();
            Object v = p.value();
            p.space();
            if (p.at != p.s.length()) throw p.error("trailing characters");
            return v;
        }

        private IllegalArgumentException error(String what) {
            return new IllegalArgumentException(what + " at " + at);
        }

        private void space() {
            while (at < s.length() && " \t\r\n".indexOf(s.charAt(at)) >= 0) at++;
        }

        private char peek() {
            if (at >= s.length()) throw error("unexpected end");
            return s.charAt(at);
        }

        private void expect(String word) {
            if (!s.startsWith(word, at)) throw error("expected " + word);
            at += word.length();
        }

        private Object value() {
            char c = peek();
            switch (c) {
                case '{': {
                    at++;
                    Map<String, Object> m = new LinkedHashMap<>();
                    space();
                    if (peek() == '}') {
                        at++;
                        return m;
                    }
                    while (true) {
                        space();
                        if (peek() != '"') throw error("expected a key");
                        String k = string();
                        space();
                        expect(":");
                        space();
                        m.put(k, value());
                        space();
                        if (peek() == ',') {
                            at++;
                            continue;
                        }
                        expect("}");
                        return m;
                    }
                }
                case '[': {
                    at++;
                    List<Object> l = new ArrayList<>();
                    space();
                    if (peek() == ']') {
                        at++;
                        return l;
                    }
                    while (true) {
                        space();
                        l.add(value());
                        space();
                        if (peek() == ',') {
                            at++;
                            continue;
                        }
                        expect("]");
                        return l;
                    }
                }
                case '"':
                    return string();
                case 't':
                    expect("true");
                    return Boolean.TRUE;
                case 'f':
                    expect("false");
                    return Boolean.FALSE;
                case 'n':
                    expect("null");
                    return null;
                default:
                    return number();
            }
        }

        private String string() {
            expect("\"");
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = peek();
                at++;
                if (c == '"') return b.toString();
                if (c < 0x20) throw error("control character in a string");
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                char e = peek();
                at++;
                switch (e) {
                    case '"', '\\', '/' -> b.append(e);
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> {
                        if (at + 4 > s.length()) throw error("short \\u escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(at, at + 4), 16));
                        } catch (NumberFormatException x) {
                            throw error("bad \\u escape");
                        }
                        at += 4;
                    }
                    default -> throw error("bad escape");
                }
            }
        }

        private Object number() {
            int start = at;
            while (at < s.length() && "+-0123456789.eE".indexOf(s.charAt(at)) >= 0) at++;
            if (start == at) throw error("unexpected character");
            try {
                return Double.parseDouble(s.substring(start, at));
            } catch (NumberFormatException e) {
                throw error("bad number");
            }
        }

        static String write(Object v) {
            if (v == null) return "null";
            if (v instanceof String str) return quote(str);
            if (v instanceof Number || v instanceof Boolean) return v.toString();
            if (v instanceof Map<?, ?> m) {
                StringBuilder b = new StringBuilder("{");
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    if (b.length() > 1) b.append(", ");
                    b.append(quote(String.valueOf(e.getKey()))).append(": ").append(write(e.getValue()));
                }
                return b.append('}').toString();
            }
            return quote(v.toString());
        }

        static String quote(String str) {
            StringBuilder b = new StringBuilder("\"");
            for (char c : str.toCharArray()) {
                switch (c) {
                    case '"' -> b.append("\\\"");
                    case '\\' -> b.append("\\\\");
                    case '\n' -> b.append("\\n");
                    case '\r' -> b.append("\\r");
                    case '\t' -> b.append("\\t");
                    default -> {
                        if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                        else b.append(c);
                    }
                }
            }
            return b.append('"').toString();
        }
    }
}
