/* The delay proxy of scripts/delay_proxy.py in C: a TCP proxy that adds a fixed one-way delay in
 * both directions (the user-space stand-in for `tc netem` in scripts/wan_emulation.py).
 *
 *     build/delay_proxy --listen 10.77.0.101:31400 --target 127.0.0.1:31400 --delay-ms 25
 *
 * Same behaviour and flags as the Python one: every chunk read from one side is written to the other
 * side `delay` later while reading goes on (a pipeline, not a throughput cap), EOF is passed on after
 * the same delay, and at most MAX_QUEUED bytes wait per direction (a slow receiver pushes back on
 * the sender). Why a C twin: on a 2-core machine eight Python proxies took ~0.27 CPU-s of every
 * 8-peer round (benchmarks/wan.md), CPU that a real WAN's latency does not cost the peers. One
 * thread, epoll, level-triggered; the next due chunk sets epoll's timeout. Built on demand by
 * scripts/delay_proxy.py (native_binary) with the system's C compiler.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64 << 10)
#define MAX_QUEUED (4 << 20) /* bytes per direction: more than 100 Mbit/s x 50 ms (625 KB) in flight */

struct chunk {
    struct chunk *next;
    double due; /* CLOCK_MONOTONIC seconds */
    size_t len, off;
    int eof;
    char data[];
};

struct direction { /* bytes read from `from`, written to `to` */
    int from, to;
    struct chunk *head, *tail;
    size_t queued;
    int read_done;  /* EOF (or an error) read from `from`: nothing more to queue */
    int write_done; /* EOF passed on to `to` */
    int blocked;    /* `to` refused bytes: wait for EPOLLOUT */
};

struct conn;
struct endpoint { struct conn *conn; int side; }; /* side 0: the client's socket, 1: the target's */

struct conn {
    int fd[2];
    unsigned mask[2];      /* epoll interest registered for fd[side] */
    int removed[2];        /* fd[side] taken out of epoll (hung up, read to its end) */
    struct direction d[2]; /* d[0]: client -> target, d[1]: target -> client */
    struct endpoint ends[2];
    struct conn *prev, *next;
};

static int epfd;
static double delay_s;
static struct conn *conns;
static volatile sig_atomic_t stopping;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_signal(int sig) { (void)sig; stopping = 1; }

static int parse_address(const char *text, struct sockaddr_in *out) {
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text) return -1;
    char host[64];
    size_t n = (size_t)(colon - text);
    if (n >= sizeof host) return -1;
    memcpy(host, text, n);
    host[n] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535) return -1;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((unsigned short)port);
    return inet_pton(AF_INET, host, &out->sin_addr) == 1 ? 0 : -1;
}

static void set_socket_options(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* as asyncio's streams do */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void close_conn(struct conn *c) {
    for (int side = 0; side < 2; side++) {
        if (!c->removed[side]) epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd[side], NULL);
        close(c->fd[side]);
        struct chunk *k = c->d[side].head;
        while (k) {
            struct chunk *next = k->next;
            free(k);
            k = next;
        }
    }
    if (c->prev) c->prev->next = c->next; else conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c);
}

/* Register what each socket waits for: reading while its direction has room, writing while the
 * other direction is blocked on it. */
static void update_interest(struct conn *c) {
    for (int side = 0; side < 2; side++) {
        struct direction *in = &c->d[side], *out = &c->d[1 - side];
        unsigned mask = 0;
        if (!in->read_done && in->queued < MAX_QUEUED) mask |= EPOLLIN;
        if (out->blocked) mask |= EPOLLOUT;
        if (mask != c->mask[side] && !c->removed[side]) {
            struct epoll_event ev = {.events = mask, .data.ptr = &c->ends[side]};
            epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd[side], &ev);
            c->mask[side] = mask;
        }
    }
}

static void enqueue(struct direction *d, const char *data, size_t len, int eof) {
    struct chunk *k = malloc(sizeof *k + len);
    if (!k) { perror("delay_proxy: malloc"); exit(1); }
    k->next = NULL;
    k->due = now() + delay_s;
    k->len = len;
    k->off = 0;
    k->eof = eof;
    if (len) memcpy(k->data, data, len); /* an EOF marker has no bytes (and data is NULL) */
    if (d->tail) d->tail->next = k; else d->head = k;
    d->tail = k;
    d->queued += len;
}

/* Read what `from` has (one chunk). */
static void read_side(struct direction *d) {
    static char buffer[CHUNK];
    ssize_t n = read(d->from, buffer, sizeof buffer);
    if (n > 0) {
        enqueue(d, buffer, (size_t)n, 0);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        enqueue(d, NULL, 0, 1); /* EOF or a reset: passed on after the delay, like the Python one */
        d->read_done = 1;
    }
}

/* Write the chunks that are due. Returns -1 when the connection must close. */
static int write_side(struct direction *d, double t) {
    d->blocked = 0;
    while (d->head && d->head->due <= t) {
        struct chunk *k = d->head;
        if (k->eof) {
            shutdown(d->to, SHUT_WR);
            d->write_done = 1;
        } else {
            ssize_t n = write(d->to, k->data + k->off, k->len - k->off);
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR) { d->blocked = 1; return 0; }
                return -1;
            }
            k->off += (size_t)n;
            d->queued -= (size_t)n;
            if (k->off < k->len) { d->blocked = 1; return 0; }
        }
        d->head = k->next;
        if (!d->head) d->tail = NULL;
        free(k);
    }
    return 0;
}

static void accept_one(int listener, const struct sockaddr_in *target) {
    int client = accept(listener, NULL, NULL);
    if (client < 0) return;
    int server = socket(AF_INET, SOCK_STREAM, 0);
    if (server < 0 || connect(server, (const struct sockaddr *)target, sizeof *target) < 0) {
        if (server >= 0) close(server);
        close(client);
        return;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c) { perror("delay_proxy: calloc"); exit(1); }
    c->fd[0] = client;
    c->fd[1] = server;
    c->d[0].from = client; c->d[0].to = server;
    c->d[1].from = server; c->d[1].to = client;
    for (int side = 0; side < 2; side++) {
        set_socket_options(c->fd[side]);
        c->ends[side] = (struct endpoint){c, side};
        c->mask[side] = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->ends[side]};
        epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd[side], &ev);
    }
    c->next = conns;
    if (conns) conns->prev = c;
    conns = c;
}

/* epoll's timeout in ms: until the earliest due chunk of a direction not waiting for EPOLLOUT. */
static int next_timeout_ms(double t) {
    double earliest = -1;
    for (struct conn *c = conns; c; c = c->next)
        for (int side = 0; side < 2; side++) {
            struct direction *d = &c->d[side];
            if (d->head && !d->blocked && (earliest < 0 || d->head->due < earliest)) earliest = d->head->due;
        }
    if (earliest < 0) return 1000; /* wake now and then to notice a signal */
    double ms = (earliest - t) * 1000.0;
    return ms <= 0 ? 0 : (int)ms + 1;
}

static void usage(const char *self) {
    fprintf(stderr, "usage: %s --listen HOST:PORT --target HOST:PORT --delay-ms MS\n", self);
    exit(2);
}

int main(int argc, char **argv) {
    const char *listen_text = NULL, *target_text = NULL;
    double delay_ms = -1;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage(argv[0]);
        if (!strcmp(argv[i], "--listen")) listen_text = argv[++i];
        else if (!strcmp(argv[i], "--target")) target_text = argv[++i];
        else if (!strcmp(argv[i], "--delay-ms")) {
            char *end;
            delay_ms = strtod(argv[++i], &end);
            if (*end) usage(argv[0]);
        } else usage(argv[0]);
    }
    struct sockaddr_in listen_at, target;
    if (!listen_text || !target_text || delay_ms < 0) usage(argv[0]);
    if (parse_address(listen_text, &listen_at) < 0 || parse_address(target_text, &target) < 0) {
        fprintf(stderr, "delay_proxy: use HOST:PORT with an IPv4 address (got %s, %s)\n", listen_text, target_text);
        return 2;
    }
    delay_s = delay_ms / 1000.0;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, (struct sockaddr *)&listen_at, sizeof listen_at) < 0 || listen(listener, 128) < 0) {
        fprintf(stderr, "delay_proxy: cannot listen on %s: %s\n", listen_text, strerror(errno));
        return 1;
    }
    epfd = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(epfd, EPOLL_CTL_ADD, listener, &lev);
    printf("delay proxy %s -> %s (+%.0f ms each way)\n", listen_text, target_text, delay_ms);
    fflush(stdout);

    struct epoll_event events[64];
    while (!stopping) {
        int n = epoll_wait(epfd, events, 64, next_timeout_ms(now()));
        if (n < 0 && errno != EINTR) { perror("delay_proxy: epoll_wait"); return 1; }
        for (int i = 0; i < n; i++) {
            struct endpoint *e = events[i].data.ptr;
            if (!e) { accept_one(listener, &target); continue; }
            struct conn *c = e->conn;
            struct direction *d = &c->d[e->side];
            if (!d->read_done && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_side(d);
            else if (d->read_done && (events[i].events & (EPOLLHUP | EPOLLERR)) && !c->removed[e->side]) {
                /* hung up and read to its end: epoll would report it on every wait; what is still
                 * due towards it is written on the timer (and fails there if the socket is gone) */
                epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd[e->side], NULL);
                c->removed[e->side] = 1;
            }
        }
        /* Write what is due (and what a socket that became writable can take), drop finished
         * connections, and re-register interests. */
        double t = now();
        struct conn *c = conns;
        while (c) {
            struct conn *next = c->next;
            int failed = write_side(&c->d[0], t) < 0 || write_side(&c->d[1], t) < 0;
            if (failed || (c->d[0].write_done && c->d[1].write_done)) close_conn(c);
            else update_interest(c);
            c = next;
        }
    }
    return 0;
}
