package com.alibaba.fastjson.serializer;

/** The one fastjson type RemotingSerializable names in a signature; see JSON. */
public enum SerializerFeature {
    PrettyFormat
}
