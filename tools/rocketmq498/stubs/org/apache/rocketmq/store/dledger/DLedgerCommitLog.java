package org.apache.rocketmq.store.dledger;

import org.apache.rocketmq.store.CommitLog;
import org.apache.rocketmq.store.DefaultMessageStore;

/**
 * Replaces 4.9.8's DLedgerCommitLog (DLedger is not packaged by Debian). DefaultMessageStore builds it
 * only with enableDLegerCommitLog=true, which the HA check never sets; the rest of the store only asks
 * "instanceof DLedgerCommitLog", which stays false.
 */
public class DLedgerCommitLog extends CommitLog {
    public DLedgerCommitLog(DefaultMessageStore defaultMessageStore) {
        super(defaultMessageStore);
        throw new UnsupportedOperationException("DLedger mode is not part of the 4.9.8 HA check");
    }

    public Server getdLedgerServer() {
        throw new UnsupportedOperationException("DLedger mode is not part of the 4.9.8 HA check");
    }

    /** The shape of DLedgerServer that DefaultMessageStore reads in DLedger mode. */
    public interface Server {
        Config getdLedgerConfig();
    }

    /** The shape of DLedgerConfig that DefaultMessageStore reads in DLedger mode. */
    public interface Config {
        String getDataStorePath();
    }
}
