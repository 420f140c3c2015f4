"""Producer process: `python produce_main.py NAMESRV TOPIC FIRST LAST [ACCESS_KEY SECRET_KEY]`
sends keys FIRST..LAST-1, signing its requests when given an ACL account.

Run apart from the consumers: in one process the C++ client shares one client instance between
producer and consumer, and a producer started while that instance is still placing the consumer
can fail its first route lookup ("No route info of this topic").
"""

import sys

from clients import send_range

if __name__ == "__main__":
    namesrv, topic, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    credentials = tuple(sys.argv[5:7]) or None
    send_range(namesrv, topic, range(first, last), credentials=credentials)
    print(f"sent {last - first}")
