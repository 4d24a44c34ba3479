"""The code enums against RocketMQ 4.9.7's own tables.

The two tables below are every ``public static final int`` of apache/rocketmq's
``common/protocol/RequestCode.java`` and of ``common/protocol/ResponseCode.java`` with the
``remoting/protocol/RemotingSysResponseCode.java`` codes it extends, at tag rocketmq-all-4.9.7,
by number. A code missing from our enums, or one we name differently, fails here.
"""

from common.remoting.codes import (
    DLedgerRequestCode,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)

ROCKETMQ_4_9_7_REQUEST_CODES: dict[int, str] = {
    10: "SEND_MESSAGE",
    11: "PULL_MESSAGE",
    12: "QUERY_MESSAGE",
    13: "QUERY_BROKER_OFFSET",
    14: "QUERY_CONSUMER_OFFSET",
    15: "UPDATE_CONSUMER_OFFSET",
    17: "UPDATE_AND_CREATE_TOPIC",
    21: "GET_ALL_TOPIC_CONFIG",
    22: "GET_TOPIC_CONFIG_LIST",
    23: "GET_TOPIC_NAME_LIST",
    25: "UPDATE_BROKER_CONFIG",
    26: "GET_BROKER_CONFIG",
    27: "TRIGGER_DELETE_FILES",
    28: "GET_BROKER_RUNTIME_INFO",
    29: "SEARCH_OFFSET_BY_TIMESTAMP",
    30: "GET_MAX_OFFSET",
    31: "GET_MIN_OFFSET",
    32: "GET_EARLIEST_MSG_STORETIME",
    33: "VIEW_MESSAGE_BY_ID",
    34: "HEART_BEAT",
    35: "UNREGISTER_CLIENT",
    36: "CONSUMER_SEND_MSG_BACK",
    37: "END_TRANSACTION",
    38: "GET_CONSUMER_LIST_BY_GROUP",
    39: "CHECK_TRANSACTION_STATE",
    40: "NOTIFY_CONSUMER_IDS_CHANGED",
    41: "LOCK_BATCH_MQ",
    42: "UNLOCK_BATCH_MQ",
    43: "GET_ALL_CONSUMER_OFFSET",
    45: "GET_ALL_DELAY_OFFSET",
    46: "CHECK_CLIENT_CONFIG",
    50: "UPDATE_AND_CREATE_ACL_CONFIG",
    51: "DELETE_ACL_CONFIG",
    52: "GET_BROKER_CLUSTER_ACL_INFO",
    53: "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG",
    54: "GET_BROKER_CLUSTER_ACL_CONFIG",
    100: "PUT_KV_CONFIG",
    101: "GET_KV_CONFIG",
    102: "DELETE_KV_CONFIG",
    103: "REGISTER_BROKER",
    104: "UNREGISTER_BROKER",
    105: "GET_ROUTEINFO_BY_TOPIC",
    106: "GET_BROKER_CLUSTER_INFO",
    200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    201: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
    202: "GET_TOPIC_STATS_INFO",
    203: "GET_CONSUMER_CONNECTION_LIST",
    204: "GET_PRODUCER_CONNECTION_LIST",
    205: "WIPE_WRITE_PERM_OF_BROKER",
    206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
    207: "DELETE_SUBSCRIPTIONGROUP",
    208: "GET_CONSUME_STATS",
    209: "SUSPEND_CONSUMER",
    210: "RESUME_CONSUMER",
    211: "RESET_CONSUMER_OFFSET_IN_CONSUMER",
    212: "RESET_CONSUMER_OFFSET_IN_BROKER",
    213: "ADJUST_CONSUMER_THREAD_POOL",
    214: "WHO_CONSUME_THE_MESSAGE",
    215: "DELETE_TOPIC_IN_BROKER",
    216: "DELETE_TOPIC_IN_NAMESRV",
    219: "GET_KVLIST_BY_NAMESPACE",
    220: "RESET_CONSUMER_CLIENT_OFFSET",
    221: "GET_CONSUMER_STATUS_FROM_CLIENT",
    222: "INVOKE_BROKER_TO_RESET_OFFSET",
    223: "INVOKE_BROKER_TO_GET_CONSUMER_STATUS",
    224: "GET_TOPICS_BY_CLUSTER",
    300: "QUERY_TOPIC_CONSUME_BY_WHO",
    301: "REGISTER_FILTER_SERVER",
    302: "REGISTER_MESSAGE_FILTER_CLASS",
    303: "QUERY_CONSUME_TIME_SPAN",
    304: "GET_SYSTEM_TOPIC_LIST_FROM_NS",
    305: "GET_SYSTEM_TOPIC_LIST_FROM_BROKER",
    306: "CLEAN_EXPIRED_CONSUMEQUEUE",
    307: "GET_CONSUMER_RUNNING_INFO",
    308: "QUERY_CORRECTION_OFFSET",
    309: "CONSUME_MESSAGE_DIRECTLY",
    310: "SEND_MESSAGE_V2",
    311: "GET_UNIT_TOPIC_LIST",
    312: "GET_HAS_UNIT_SUB_TOPIC_LIST",
    313: "GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST",
    314: "CLONE_GROUP_OFFSET",
    315: "VIEW_BROKER_STATS_DATA",
    316: "CLEAN_UNUSED_TOPIC",
    317: "GET_BROKER_CONSUME_STATS",
    318: "UPDATE_NAMESRV_CONFIG",
    319: "GET_NAMESRV_CONFIG",
    320: "SEND_BATCH_MESSAGE",
    321: "QUERY_CONSUME_QUEUE",
    322: "QUERY_DATA_VERSION",
    323: "RESUME_CHECK_HALF_MESSAGE",
    324: "SEND_REPLY_MESSAGE",
    325: "SEND_REPLY_MESSAGE_V2",
    326: "PUSH_REPLY_MESSAGE_TO_CLIENT",
    327: "ADD_WRITE_PERM_OF_BROKER",
    328: "GET_ALL_PRODUCER_INFO",
    329: "DELETE_EXPIRED_COMMITLOG",
}

ROCKETMQ_4_9_7_RESPONSE_CODES: dict[int, str] = {
    0: "SUCCESS",
    1: "SYSTEM_ERROR",
    2: "SYSTEM_BUSY",
    3: "REQUEST_CODE_NOT_SUPPORTED",
    4: "TRANSACTION_FAILED",
    10: "FLUSH_DISK_TIMEOUT",
    11: "SLAVE_NOT_AVAILABLE",
    12: "FLUSH_SLAVE_TIMEOUT",
    13: "MESSAGE_ILLEGAL",
    14: "SERVICE_NOT_AVAILABLE",
    15: "VERSION_NOT_SUPPORTED",
    16: "NO_PERMISSION",
    17: "TOPIC_NOT_EXIST",
    18: "TOPIC_EXIST_ALREADY",
    19: "PULL_NOT_FOUND",
    20: "PULL_RETRY_IMMEDIATELY",
    21: "PULL_OFFSET_MOVED",
    22: "QUERY_NOT_FOUND",
    23: "SUBSCRIPTION_PARSE_FAILED",
    24: "SUBSCRIPTION_NOT_EXIST",
    25: "SUBSCRIPTION_NOT_LATEST",
    26: "SUBSCRIPTION_GROUP_NOT_EXIST",
    27: "FILTER_DATA_NOT_EXIST",
    28: "FILTER_DATA_NOT_LATEST",
    200: "TRANSACTION_SHOULD_COMMIT",
    201: "TRANSACTION_SHOULD_ROLLBACK",
    202: "TRANSACTION_STATE_UNKNOW",
    203: "TRANSACTION_STATE_GROUP_WRONG",
    204: "NO_BUYER_ID",
    205: "NOT_IN_CURRENT_UNIT",
    206: "CONSUMER_NOT_ONLINE",
    207: "CONSUME_MSG_TIMEOUT",
    208: "NO_MESSAGE",
    209: "UPDATE_AND_CREATE_ACL_CONFIG_FAILED",
    210: "DELETE_ACL_CONFIG_FAILED",
    211: "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED",
    215: "FLOW_CONTROL",
}


def test_every_rocketmq_4_9_7_request_code_is_listed_by_its_name():
    missing = {
        n: name for n, name in ROCKETMQ_4_9_7_REQUEST_CODES.items() if n not in set(RequestCode)
    }
    assert not missing, f"RequestCode lacks {missing}"
    assert {
        n: RequestCode(n).name for n in ROCKETMQ_4_9_7_REQUEST_CODES
    } == ROCKETMQ_4_9_7_REQUEST_CODES


# RocketMQ 5's pop codes (RequestCode.java 5.x; broker/processor/pop.py): above a short, so
# they travel in JSON headers only, as RocketMQ 5's clients send them
ROCKETMQ_5_POP_REQUEST_CODES = {
    200050: "POP_MESSAGE",
    200051: "ACK_MESSAGE",
    200052: "PEEK_MESSAGE",
    200053: "CHANGE_MESSAGE_INVISIBLETIME",
    200151: "BATCH_ACK_MESSAGE",
}


# RocketMQ 5's timer checkpoint code (RequestCode.java 5.x; a slave's sync asks its master)
ROCKETMQ_5_TIMER_REQUEST_CODES = {60: "GET_TIMER_CHECK_POINT"}


def test_request_codes_are_exactly_rocketmq_4_9_7s_and_5s_pop_codes():
    assert {c.value for c in RequestCode} == set(ROCKETMQ_4_9_7_REQUEST_CODES) | set(
        ROCKETMQ_5_POP_REQUEST_CODES
    ) | set(ROCKETMQ_5_TIMER_REQUEST_CODES)
    assert {n: RequestCode(n).name for n in ROCKETMQ_5_TIMER_REQUEST_CODES} == (
        ROCKETMQ_5_TIMER_REQUEST_CODES
    )
    assert {n: RequestCode(n).name for n in ROCKETMQ_5_POP_REQUEST_CODES} == (
        ROCKETMQ_5_POP_REQUEST_CODES
    )
    assert int(ResponseCode.POLLING_FULL) == 209 and int(ResponseCode.POLLING_TIMEOUT) == 210


def test_every_rocketmq_4_9_7_response_code_is_listed_by_its_name():
    missing = {
        n: name for n, name in ROCKETMQ_4_9_7_RESPONSE_CODES.items() if n not in set(ResponseCode)
    }
    assert not missing, f"ResponseCode lacks {missing}"
    assert {
        n: ResponseCode(n).name for n in ROCKETMQ_4_9_7_RESPONSE_CODES
    } == ROCKETMQ_4_9_7_RESPONSE_CODES
    assert {c.value for c in ResponseCode} == set(ROCKETMQ_4_9_7_RESPONSE_CODES)


def test_request_codes_are_unique_and_fit_a_short():
    values = [c.value for c in RequestCode]
    assert len(values) == len(set(values))
    assert all(0 < v < 0x8000 for v in values if v not in ROCKETMQ_5_POP_REQUEST_CODES)


def test_response_codes():
    assert int(ResponseCode.SUCCESS) == 0
    assert int(ResponseCode.SYSTEM_ERROR) == 1
    assert int(ResponseCode.REQUEST_CODE_NOT_SUPPORTED) == 3
    assert int(ResponseCode.FLUSH_DISK_TIMEOUT) == 10
    assert int(ResponseCode.SLAVE_NOT_AVAILABLE) == 11
    assert int(ResponseCode.FLUSH_SLAVE_TIMEOUT) == 12
    assert int(ResponseCode.TOPIC_NOT_EXIST) == 17
    assert int(ResponseCode.PULL_NOT_FOUND) == 19
    assert int(ResponseCode.PULL_OFFSET_MOVED) == 21
    assert int(ResponseCode.QUERY_NOT_FOUND) == 22
    assert int(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST) == 26
    assert int(ResponseCode.NO_BUYER_ID) == 204
    assert int(ResponseCode.FLOW_CONTROL) == 215


def test_language_and_serialize_type():
    assert (
        int(LanguageCode.JAVA) == 0 and int(LanguageCode.CPP) == 1 and int(LanguageCode.PYTHON) == 3
    )
    assert int(LanguageCode.GO) == 9 and int(LanguageCode.RUST) == 12
    assert int(SerializeType.JSON) == 0 and int(SerializeType.ROCKETMQ) == 1


def test_dledger_codes_do_not_fit_binary_header():
    assert int(DLedgerRequestCode.VOTE) == 51001
    assert all(c.value > 0x7FFF for c in DLedgerRequestCode)
