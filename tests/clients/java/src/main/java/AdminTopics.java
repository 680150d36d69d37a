import java.util.Collections;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.AdminClient;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.errors.TopicExistsException;

/**
 * CensusJavaClient's admin calls, through AdminClient: from kafka-clients 0.11 (KIP-117) to 4.x
 * (the Admin interface it implements came in 2.4 and would not compile before). Left out of the
 * build for older releases (pom.xml, profile no-admin-client); CensusJavaClient finds it by name.
 */
public final class AdminTopics implements CensusJavaClient.Topics {
    private final AdminClient admin;

    public AdminTopics(Properties config) {
        admin = AdminClient.create(config);
    }

    @Override
    public void create(String topic) throws Exception {
        try {
            admin.createTopics(Collections.singleton(new NewTopic(topic, 1, (short) 1)))
                    .all().get(CensusJavaClient.WAIT_S, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {  // already there is fine
                throw e;
            }
        }
    }

    @Override
    public Set<String> names() throws Exception {
        return admin.listTopics().names().get(CensusJavaClient.WAIT_S, TimeUnit.SECONDS);
    }

    @Override
    public void close() {
        admin.close();
    }
}
