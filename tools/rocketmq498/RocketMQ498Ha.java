import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * A real RocketMQ 4.9.8 DefaultMessageStore, as master (with its HA port) or as slave (following a
 * haMasterAddress), driven line by line on stdin so that a test can put messages and read offsets:
 *
 * <pre>
 *   java RocketMQ498Ha SLAVE|ASYNC_MASTER|SYNC_MASTER STORE_DIR FILE_SIZE HA_PORT|MASTER_HOST:PORT
 *   put N [B] put N messages (topic HaTopic, queues 0..3), bodies of B bytes or of 650 to 1,560;
 *             answers "put STATUS=COUNT ..."
 *   max       answers "max MAX_PHY_OFFSET"
 *   queues    answers "queues COUNT": the messages the store's own dispatch put in HaTopic's ConsumeQueues
 *   slaves    answers "slaves COUNT": the slave connections on this master's HA port
 *   quit      shuts the store down; answers "bye"
 * </pre>
 */
public final class RocketMQ498Ha {
    private static final String TOPIC = "HaTopic";
    private static final int QUEUES = 4;

    private RocketMQ498Ha() {
    }

    public static void main(String[] args) throws Exception {
        BrokerRole role = BrokerRole.valueOf(args[0]);
        MessageStoreConfig config = new MessageStoreConfig();
        config.setBrokerRole(role);
        config.setStorePathRootDir(args[1]);
        config.setStorePathCommitLog(args[1] + "/commitlog");
        config.setMappedFileSizeCommitLog(Integer.parseInt(args[2]));
        config.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        config.setHaSendHeartbeatInterval(500);
        config.setHaTransferBatchSize(4096);  // frames end inside records
        config.setSyncFlushTimeout(10000);  // SYNC_MASTER's wait for the slave: a loaded machine
        if (role == BrokerRole.SLAVE) {
            config.setHaListenPort(0);  // a slave's HAService still listens: any free port
            config.setHaMasterAddress(args[3]);
        } else {
            config.setHaListenPort(Integer.parseInt(args[3]));
        }
        BrokerConfig brokerConfig = new BrokerConfig();
        // A 4.9.8 broker refuses a SLAVE with brokerId 0; the store's dispatch takes brokerId 0 for a
        // master, which skips the rest of a read on a record it cannot parse (a slave's half-received tail).
        brokerConfig.setBrokerId(role == BrokerRole.SLAVE ? 1 : 0);
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("ha-check", true),
            null, brokerConfig);
        if (!store.load()) {
            throw new IllegalStateException("DefaultMessageStore.load failed");
        }
        if (role == BrokerRole.SLAVE) {
            store.updateHaMasterAddress(args[3]);  // before start(), as BrokerController.initialize does
        }
        store.start();
        System.out.println("ready");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        long sent = 0;
        for (String line; (line = in.readLine()) != null; ) {
            String[] words = line.trim().split(" ");
            if (words[0].equals("put")) {
                int count = Integer.parseInt(words[1]);
                int bodyBytes = words.length > 2 ? Integer.parseInt(words[2]) : 0;
                Map<String, Integer> statuses = new TreeMap<>();
                for (int i = 0; i < count; i++, sent++) {
                    PutMessageResult result = store.putMessage(message(sent, bodyBytes));
                    statuses.merge(result.getPutMessageStatus().name(), 1, Integer::sum);
                }
                StringBuilder answer = new StringBuilder("put");
                statuses.forEach((status, n) -> answer.append(' ').append(status).append('=').append(n));
                System.out.println(answer);
            } else if (words[0].equals("max")) {
                System.out.println("max " + store.getMaxPhyOffset());
            } else if (words[0].equals("queues")) {
                long total = 0;
                for (int queue = 0; queue < QUEUES; queue++) {
                    total += store.getMaxOffsetInQueue(TOPIC, queue);
                }
                System.out.println("queues " + total);
            } else if (words[0].equals("slaves")) {
                System.out.println("slaves " + store.getHaService().getConnectionCount().get());
            } else if (words[0].equals("quit")) {
                break;
            }
            System.out.flush();
        }
        store.shutdown();
        System.out.println("bye");
        System.out.flush();
        System.exit(0);
    }

    /** As 4.9.8's own store tests build one: keys, tags, born and store hosts, the properties string. */
    private static MessageExtBrokerInner message(long i, int bodyBytes) {
        MessageExtBrokerInner msg = new MessageExtBrokerInner();
        msg.setTopic(TOPIC);
        msg.setTags("TagA");
        msg.setKeys("k" + i);
        String body = ("java-498-" + i + "-").repeat(bodyBytes > 0 ? bodyBytes : 50 + (int) (i % 70));
        msg.setBody((bodyBytes > 0 ? body.substring(0, bodyBytes) : body).getBytes(StandardCharsets.UTF_8));
        msg.setQueueId((int) (i % QUEUES));
        msg.setSysFlag(0);
        msg.setBornTimestamp(System.currentTimeMillis());
        msg.setBornHost(new InetSocketAddress("127.0.0.1", 8123));
        msg.setStoreHost(new InetSocketAddress("127.0.0.1", 10911));
        msg.setPropertiesString(MessageDecoder.messageProperties2String(msg.getProperties()));
        msg.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(msg.getTags()));
        return msg;
    }
}
