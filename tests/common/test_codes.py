from common.remoting.codes import (
    DLedgerRequestCode,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)


def test_request_codes_match_rocketmq_numbers():
    expected = {
        "SEND_MESSAGE": 10,
        "PULL_MESSAGE": 11,
        "QUERY_CONSUMER_OFFSET": 14,
        "UPDATE_CONSUMER_OFFSET": 15,
        "UPDATE_AND_CREATE_TOPIC": 17,
        "GET_ALL_TOPIC_CONFIG": 21,
        "GET_BROKER_RUNTIME_INFO": 28,
        "GET_MAX_OFFSET": 30,
        "VIEW_MESSAGE_BY_ID": 33,
        "HEART_BEAT": 34,
        "UNREGISTER_CLIENT": 35,
        "CONSUMER_SEND_MSG_BACK": 36,
        "END_TRANSACTION": 37,
        "GET_CONSUMER_LIST_BY_GROUP": 38,
        "CHECK_TRANSACTION_STATE": 39,
        "NOTIFY_CONSUMER_IDS_CHANGED": 40,
        "LOCK_BATCH_MQ": 41,
        "UNLOCK_BATCH_MQ": 42,
        "GET_ALL_CONSUMER_OFFSET": 43,
        "GET_ALL_DELAY_OFFSET": 45,
        "PUT_KV_CONFIG": 100,
        "REGISTER_BROKER": 103,
        "UNREGISTER_BROKER": 104,
        "GET_ROUTEINFO_BY_TOPIC": 105,
        "GET_BROKER_CLUSTER_INFO": 106,
        "WIPE_WRITE_PERM_OF_BROKER": 205,
        "GET_ALL_TOPIC_LIST_FROM_NAMESERVER": 206,
        "DELETE_TOPIC_IN_NAMESRV": 216,
        "GET_KVLIST_BY_NAMESPACE": 219,
        "GET_TOPICS_BY_CLUSTER": 224,
        "GET_SYSTEM_TOPIC_LIST_FROM_NS": 304,
        "SEND_MESSAGE_V2": 310,
        "UPDATE_NAMESRV_CONFIG": 318,
        "GET_NAMESRV_CONFIG": 319,
        "SEND_BATCH_MESSAGE": 320,
        "QUERY_DATA_VERSION": 322,
        "SEND_REPLY_MESSAGE_V2": 325,
        "ADD_WRITE_PERM_OF_BROKER": 327,
    }
    for name, number in expected.items():
        assert RequestCode[name] == number


def test_request_codes_are_unique_and_fit_a_short():
    values = [c.value for c in RequestCode]
    assert len(values) == len(set(values))
    assert all(0 < v < 0x8000 for v in values)


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
