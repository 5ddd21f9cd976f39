package com.alibaba.fastjson;

import com.alibaba.fastjson.serializer.SerializerFeature;

/**
 * Stands in for fastjson (not packaged by Debian). The store reaches it only through
 * RemotingSerializable, for delayOffset.json: a null document makes ConfigManager.persist write
 * nothing, and a fresh store never has a file to parse.
 */
public final class JSON {
    private JSON() {
    }

    public static String toJSONString(Object object, boolean prettyFormat) {
        return null;
    }

    public static String toJSONString(Object object, SerializerFeature... features) {
        return null;
    }

    public static <T> T parseObject(String text, Class<T> clazz) {
        throw new UnsupportedOperationException("fastjson is stubbed in the 4.9.8 HA check");
    }
}
