"""A Unix-socket proxy in front of a PostgreSQL server, for the tests.

    pg_proxy.py LISTEN_PATH SERVER_PATH DOWN_FLAG REFUSED_LOG

While the file DOWN_FLAG exists, every connection through the proxy is cut
and new ones are refused, each refusal noted as a line in REFUSED_LOG: to
the client the server is unreachable. Once the connections are cut the
proxy creates DOWN_FLAG.cut, and removes it when DOWN_FLAG goes. Runs until
killed.
"""
import os
import socket
import sys
import threading
import time

listen_path, server_path, down_flag, refused_log = sys.argv[1:5]
pairs = []
lock = threading.Lock()


def cut(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    cut(src, dst)


def watch():
    while True:
        if os.path.exists(down_flag):
            with lock:
                for pair in pairs:
                    cut(*pair)
                pairs.clear()
            if not os.path.exists(down_flag + ".cut"):
                open(down_flag + ".cut", "w").close()
        elif os.path.exists(down_flag + ".cut"):
            os.remove(down_flag + ".cut")
        time.sleep(0.02)


def refuse(client):
    client.close()
    with open(refused_log, "a") as f:
        f.write("refused\n")


srv = socket.socket(socket.AF_UNIX)
srv.bind(listen_path)
srv.listen(64)
threading.Thread(target=watch, daemon=True).start()
while True:
    client, _ = srv.accept()
    if os.path.exists(down_flag):
        refuse(client)
        continue
    server = socket.socket(socket.AF_UNIX)
    try:
        server.connect(server_path)
    except OSError:
        refuse(client)
        continue
    with lock:
        pairs.append((client, server))
    threading.Thread(target=pump, args=(client, server), daemon=True).start()
    threading.Thread(target=pump, args=(server, client), daemon=True).start()
