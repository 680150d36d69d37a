import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.management.ManagementFactory;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client (org.apache.kafka:kafka-clients) doing the test clients' short, bounded script
 * against a broker:
 *
 * <pre>
 * java -cp 'build/java-client/VERSION/*' CensusJavaClient --bootstrap H:P --topic T --group G
 *     [--client-id ID] [--group-protocol classic|consumer] [--ca PEM [--cert PEM --key PEM]]
 *     [--sasl-mechanism PLAIN|SCRAM-SHA-512 --sasl-user U --sasl-password P] [--hold]
 * </pre>
 *
 * Create the topic (admin client), produce 5 small messages (acks=all), consume them back with a
 * fresh consumer group (session timeout 6 s, heartbeat 1 s, earliest offsets; stop after 5
 * messages or 30 s), commit, read metadata, close. Prints one JSON line with what it did, like
 * tests/clients/python_client.py; exits 0 only if 5 were produced and 5 consumed.
 *
 * Without --client-id, client.id is left unset, so each of the three clients uses its own
 * default (producer-N, consumer-GROUP-N, adminclient-N). With --ca the client speaks TLS (SSL),
 * trusting the CAs in that file and checking the broker's host name; --cert/--key (an
 * unencrypted PKCS#8 key) add a client certificate. With --sasl-mechanism it authenticates with
 * SASL PLAIN or SCRAM-SHA-512 (SASL_PLAINTEXT, or SASL_SSL with --ca).
 *
 * --group-protocol sets the consumer's group.protocol: "consumer" joins with KIP-848's
 * ConsumerGroupHeartbeat (kafka-clients 3.7+, a Kafka 4 broker), where the broker owns the session
 * timeout and heartbeat interval, so the script sets neither.
 *
 * With --hold it does the same script, then keeps its producer and consumer (their connections
 * and its group membership) open, polling the consumer every half second, and prints one JSON
 * line {"holding": true, ...} (its report so far and its pid) until its standard input reaches
 * EOF; then it closes everything and prints its usual report.
 *
 * One source for kafka-clients 0.10.2 to 4.x, in Java 8: what differs between releases is
 * handled here (see poll) or in the build (AdminTopics, absent before 0.11: see pom.xml).
 */
public final class CensusJavaClient {
    static final int MESSAGES = 5;
    static final long CONSUME_DEADLINE_MS = 30_000;
    static final long HOLD_TICK_MS = 500;
    static final long WAIT_S = 30;

    /** The admin calls, in AdminTopics: kafka-clients before 0.11 have no admin client. */
    interface Topics extends AutoCloseable {
        /** Create the topic (one partition), or find it there already. */
        void create(String topic) throws Exception;

        Set<String> names() throws Exception;

        @Override
        void close();
    }

    static final class Args {
        String bootstrap, topic, group, clientId, groupProtocol, ca, cert, key, saslMechanism, saslUser, saslPassword;
        boolean hold;
    }

    static final String USAGE = "usage: CensusJavaClient --bootstrap H:P --topic T --group G [--client-id ID]"
            + " [--group-protocol classic|consumer] [--ca PEM [--cert PEM --key PEM]] [--sasl-mechanism PLAIN|SCRAM-SHA-512 --sasl-user U"
            + " --sasl-password P] [--hold]";

    public static void main(String[] argv) {
        Args a;
        try {
            a = parse(argv);
        } catch (IllegalArgumentException e) {
            System.err.println(e.getMessage());
            System.err.println(USAGE);
            System.exit(2);
            return;
        }
        Map<String, Object> report = new TreeMap<>();
        report.put("client", "java");
        report.put("client_package_version", kafkaClientsVersion());
        report.put("topic", a.topic);
        report.put("group", a.group);
        report.put("produced", 0);
        report.put("consumed", 0);
        if (a.clientId != null) {
            report.put("client_id", a.clientId);
        }
        if (a.saslMechanism != null) {
            report.put("sasl_mechanism", a.saslMechanism);  // never the user's password
        }
        long t0 = System.nanoTime();
        boolean ok = false;
        try {
            run(a, report);
            ok = Integer.valueOf(MESSAGES).equals(report.get("produced"))
                    && Integer.valueOf(MESSAGES).equals(report.get("consumed"));
            if (!ok) {
                report.put("error", "expected " + MESSAGES + " produced and consumed");
            }
        } catch (Throwable e) {  // report, then fail
            Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            report.put("error", cause.getClass().getSimpleName() + ": " + cause.getMessage());
            StringWriter trace = new StringWriter();
            e.printStackTrace(new PrintWriter(trace));
            System.err.print(trace);
        }
        report.put("ok", ok);
        report.put("seconds", Math.round((System.nanoTime() - t0) / 1e6) / 1000.0);
        System.out.println(json(report));
        System.out.flush();
        // Kafka's threads are gone after close(), but a failed run may have left one behind.
        System.exit(ok ? 0 : 1);
    }

    /**
     * What the client announces as its software version (KIP-511): AppInfoParser.getVersion(),
     * found by name since 4.x moved the class into common.utils.internals.
     */
    static String kafkaClientsVersion() {
        for (String name : new String[] {"org.apache.kafka.common.utils.internals.AppInfoParser",
                                         "org.apache.kafka.common.utils.AppInfoParser"}) {
            try {
                return (String) Class.forName(name).getMethod("getVersion").invoke(null);
            } catch (ReflectiveOperationException e) {
                // not in this release: try the other
            }
        }
        return "unknown";
    }

    static Args parse(String[] argv) {
        Args a = new Args();
        for (int i = 0; i < argv.length; i++) {
            String flag = argv[i];
            if (flag.equals("--hold")) {
                a.hold = true;
                continue;
            }
            if (i + 1 >= argv.length) {
                throw new IllegalArgumentException(flag + " needs a value, or is unknown");
            }
            String value = argv[++i];
            switch (flag) {
                case "--bootstrap": a.bootstrap = value; break;
                case "--topic": a.topic = value; break;
                case "--group": a.group = value; break;
                case "--client-id": a.clientId = value; break;
                case "--group-protocol": a.groupProtocol = value; break;
                case "--ca": a.ca = value; break;
                case "--cert": a.cert = value; break;
                case "--key": a.key = value; break;
                case "--sasl-mechanism": a.saslMechanism = value; break;
                case "--sasl-user": a.saslUser = value; break;
                case "--sasl-password": a.saslPassword = value; break;
                default: throw new IllegalArgumentException("unknown argument " + flag);
            }
        }
        if (a.bootstrap == null || a.topic == null || a.group == null) {
            throw new IllegalArgumentException("--bootstrap, --topic and --group are required");
        }
        if ((a.cert != null || a.key != null) && (a.ca == null || a.cert == null || a.key == null)) {
            throw new IllegalArgumentException("--cert and --key go together, and need --ca");
        }
        if (a.saslMechanism != null && !a.saslMechanism.equals("PLAIN") && !a.saslMechanism.equals("SCRAM-SHA-512")) {
            throw new IllegalArgumentException("--sasl-mechanism is PLAIN or SCRAM-SHA-512");
        }
        if ((a.saslMechanism == null) != (a.saslUser == null) || (a.saslUser == null) != (a.saslPassword == null)) {
            throw new IllegalArgumentException("--sasl-mechanism, --sasl-user and --sasl-password go together");
        }
        return a;
    }

    // ---------------------------------------------------------------------------- the script

    static void run(Args a, Map<String, Object> report) throws Exception {
        Properties common = common(a);
        report.put("security_protocol", common.getProperty("security.protocol"));

        Topics admin = admin(common);
        try {
            if (admin != null) {
                admin.create(a.topic);
                report.put("topic_created", true);
            } else {  // before 0.11: the broker creates it on the producer's Metadata request
                report.put("topic_created", "auto");
            }

            Properties pp = copy(common);
            pp.put("acks", "all");
            pp.put("linger.ms", "5");
            pp.put("max.block.ms", "30000");
            KafkaProducer<byte[], byte[]> producer =
                    new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer());
            try {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < MESSAGES; i++) {
                    sent.add(producer.send(new ProducerRecord<>(a.topic, bytes("k" + i),
                            bytes("census java message " + i))));
                }
                producer.flush();
                for (Future<RecordMetadata> f : sent) {
                    f.get(WAIT_S, TimeUnit.SECONDS);
                }
                report.put("produced", MESSAGES);

                Properties cp = copy(common);
                cp.put("group.id", a.group);
                if (a.groupProtocol != null) {  // "consumer": KIP-848's ConsumerGroupHeartbeat (kafka-clients 3.7+)
                    cp.put("group.protocol", a.groupProtocol);
                }
                if (!"consumer".equals(a.groupProtocol)) {  // the broker owns these under KIP-848
                    cp.put("session.timeout.ms", "6000");
                    cp.put("heartbeat.interval.ms", "1000");
                }
                cp.put("auto.offset.reset", "earliest");
                cp.put("enable.auto.commit", "false");  // commitSync below
                KafkaConsumer<byte[], byte[]> consumer =
                        new KafkaConsumer<>(cp, new ByteArrayDeserializer(), new ByteArrayDeserializer());
                try {
                    consumer.subscribe(Collections.singletonList(a.topic));
                    int got = 0;
                    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CONSUME_DEADLINE_MS);
                    while (got < MESSAGES && System.nanoTime() < deadline) {
                        for (ConsumerRecord<byte[], byte[]> ignored : poll(consumer, 500)) {
                            got++;
                        }
                    }
                    report.put("consumed", got);
                    if (got > 0) {
                        consumer.commitSync();
                    }
                    Map<String, Object> metadata = new TreeMap<>();
                    metadata.put("topics_seen", consumer.listTopics().containsKey(a.topic));
                    List<PartitionInfo> partitions = consumer.partitionsFor(a.topic);
                    metadata.put("partitions", partitions == null ? 0 : partitions.size());
                    if (admin != null) {
                        metadata.put("admin_topics_seen", admin.names().contains(a.topic));
                        admin.close();  // what --hold keeps open is the producer and the consumer
                        admin = null;
                    }
                    report.put("metadata", metadata);
                    if (a.hold) {
                        hold(consumer, report);
                    }
                } finally {
                    consumer.close();
                }
            } finally {
                producer.close();
            }
        } finally {
            if (admin != null) {
                admin.close();
            }
        }
    }

    static Properties common(Args a) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", a.bootstrap);
        if (a.clientId != null) {
            p.put("client.id", a.clientId);
        }
        p.put("request.timeout.ms", "15000");
        if (a.ca != null) {
            tls(p, a.ca, a.cert, a.key);
        }
        if (a.saslMechanism != null) {
            String module = a.saslMechanism.equals("PLAIN")
                    ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                    : "org.apache.kafka.common.security.scram.ScramLoginModule";
            p.put("sasl.mechanism", a.saslMechanism);
            p.put("sasl.jaas.config", module + " required username=" + quote(a.saslUser)
                    + " password=" + quote(a.saslPassword) + ";");
        }
        p.put("security.protocol", a.saslMechanism != null ? (a.ca != null ? "SASL_SSL" : "SASL_PLAINTEXT")
                : (a.ca != null ? "SSL" : "PLAINTEXT"));
        return p;
    }

    /** The admin client, or null where kafka-clients has none (built with -Pno-admin-client). */
    static Topics admin(Properties common) throws Exception {
        Class<?> impl;
        try {
            impl = Class.forName("AdminTopics");
        } catch (ClassNotFoundException e) {
            return null;
        }
        try {
            return (Topics) impl.getConstructor(Properties.class).newInstance(copy(common));
        } catch (InvocationTargetException e) {
            throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
        }
    }

    // Before 2.0 KafkaConsumer has poll(long) only; 4.0 removed it and kept poll(Duration) (KIP-266).
    // Looked up once, so that the same source compiles and runs against both.
    static final Method POLL = pollMethod();

    static Method pollMethod() {
        try {
            return KafkaConsumer.class.getMethod("poll", Duration.class);
        } catch (NoSuchMethodException e) {
            try {
                return KafkaConsumer.class.getMethod("poll", long.class);
            } catch (NoSuchMethodException e2) {
                throw new IllegalStateException("KafkaConsumer has neither poll(Duration) nor poll(long)", e2);
            }
        }
    }

    @SuppressWarnings("unchecked")
    static ConsumerRecords<byte[], byte[]> poll(KafkaConsumer<byte[], byte[]> consumer, long millis)
            throws Exception {
        Object timeout = POLL.getParameterTypes()[0] == Duration.class ? Duration.ofMillis(millis) : (Object) millis;
        try {
            return (ConsumerRecords<byte[], byte[]>) POLL.invoke(consumer, timeout);
        } catch (InvocationTargetException e) {
            throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
        }
    }

    // ---------------------------------------------------------------------------- --hold

    /**
     * Poll the consumer (it stays in its group past max.poll.interval.ms; KafkaConsumer is not
     * thread-safe, so only this thread touches it) until a daemon thread sees standard input at
     * EOF: the harness closes it, or dies and the pipe closes with it.
     */
    static void hold(KafkaConsumer<byte[], byte[]> consumer, Map<String, Object> report) throws Exception {
        final CountDownLatch eof = new CountDownLatch(1);
        Thread reader = new Thread(() -> {
            byte[] buffer = new byte[4096];
            try {
                while (System.in.read(buffer) >= 0) {
                    // what comes before EOF is read and ignored
                }
            } catch (IOException e) {
                // a closed or broken standard input ends the hold too
            }
            eof.countDown();
        }, "stdin-eof");
        reader.setDaemon(true);
        report.put("held", true);
        Map<String, Object> line = new TreeMap<>(report);
        line.put("holding", true);
        line.put("pid", pid());
        System.out.println(json(line));
        System.out.flush();
        long t0 = System.nanoTime();
        reader.start();
        while (eof.getCount() > 0) {
            poll(consumer, HOLD_TICK_MS);
        }
        report.put("held_seconds", Math.round((System.nanoTime() - t0) / 1e6) / 1000.0);
    }

    static long pid() {
        // ProcessHandle is Java 9: the runtime's name is "PID@HOST" on every JVM in use.
        String name = ManagementFactory.getRuntimeMXBean().getName();
        try {
            return Long.parseLong(name.substring(0, name.indexOf('@')));
        } catch (RuntimeException e) {
            return -1;
        }
    }

    // ---------------------------------------------------------------------------- TLS

    /**
     * Trust store and key store as PKCS#12 files the client writes itself from the PEM files:
     * Kafka reads PEM only from 2.7 (KIP-651), PKCS#12 (the JDK's) in every release.
     */
    static void tls(Properties p, String ca, String cert, String key) throws Exception {
        char[] password = password();
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        int n = 0;
        for (Certificate c : certificates(ca)) {
            trust.setCertificateEntry("ca-" + n++, c);
        }
        if (n == 0) {
            throw new IllegalArgumentException("no certificate in " + ca);
        }
        p.put("ssl.truststore.type", "PKCS12");
        p.put("ssl.truststore.location", store(trust, password, "truststore"));
        p.put("ssl.truststore.password", new String(password));
        if (cert != null) {
            KeyStore keys = KeyStore.getInstance("PKCS12");
            keys.load(null, null);
            List<Certificate> chain = certificates(cert);
            keys.setKeyEntry("client", privateKey(key), password, chain.toArray(new Certificate[0]));
            p.put("ssl.keystore.type", "PKCS12");
            p.put("ssl.keystore.location", store(keys, password, "keystore"));
            p.put("ssl.keystore.password", new String(password));
            p.put("ssl.key.password", new String(password));
        }
        // the default from 2.0 (KIP-294); before it, no check at all: say it for every release
        p.put("ssl.endpoint.identification.algorithm", "https");
    }

    static List<Certificate> certificates(String path) throws Exception {
        try (InputStream in = new FileInputStream(path)) {
            return new ArrayList<>(CertificateFactory.getInstance("X.509").generateCertificates(in));
        }
    }

    static PrivateKey privateKey(String path) throws Exception {
        String pem = new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.US_ASCII);
        String begin = "-----BEGIN PRIVATE KEY-----", end = "-----END PRIVATE KEY-----";
        int from = pem.indexOf(begin), to = pem.indexOf(end);
        if (from < 0 || to < from) {
            throw new IllegalArgumentException(path + " holds no unencrypted PKCS#8 key (BEGIN PRIVATE KEY)");
        }
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(
                Base64.getMimeDecoder().decode(pem.substring(from + begin.length(), to)));
        for (String algorithm : new String[] {"EC", "RSA"}) {
            try {
                return KeyFactory.getInstance(algorithm).generatePrivate(spec);
            } catch (GeneralSecurityException e) {
                // not this algorithm: try the next
            }
        }
        throw new IllegalArgumentException(path + ": neither an EC nor an RSA key");
    }

    static String store(KeyStore store, char[] password, String name) throws Exception {
        File file = File.createTempFile("census-java-" + name + "-", ".p12");
        file.deleteOnExit();
        try (OutputStream out = new FileOutputStream(file)) {
            store.store(out, password);
        }
        return file.getAbsolutePath();
    }

    static char[] password() {
        SecureRandom random = new SecureRandom();
        char[] out = new char[24];
        String alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for (int i = 0; i < out.length; i++) {
            out[i] = alphabet.charAt(random.nextInt(alphabet.length()));
        }
        return out;
    }

    // ---------------------------------------------------------------------------- small helpers

    static Properties copy(Properties p) {
        Properties out = new Properties();
        out.putAll(p);
        return out;
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** A JAAS option value: quoted, with the quote and the backslash escaped. */
    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    /** The report as one JSON line: maps (keys sorted), strings, numbers, booleans, null. */
    static String json(Object value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof Boolean || value instanceof Number) {
            return value.toString();
        }
        if (value instanceof Map) {
            StringBuilder out = new StringBuilder("{");
            for (Map.Entry<?, ?> e : new TreeMap<>((Map<?, ?>) value).entrySet()) {
                if (out.length() > 1) {
                    out.append(", ");
                }
                out.append(json(String.valueOf(e.getKey()))).append(": ").append(json(e.getValue()));
            }
            return out.append('}').toString();
        }
        String s = value.toString();
        StringBuilder out = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    private CensusJavaClient() {
    }
}
