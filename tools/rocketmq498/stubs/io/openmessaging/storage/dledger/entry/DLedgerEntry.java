package io.openmessaging.storage.dledger.entry;

/** DLedger's entry header length, the one DLedger constant DefaultMessageStore names (DLedger mode only). */
public final class DLedgerEntry {
    public static final int BODY_OFFSET = 52;

    private DLedgerEntry() {
    }
}
