// Command dedupctl operates on dedupkit's records in Redis: it looks records up,
// forgets them (so that a message runs again, every process's local tier included),
// counts them per handler, and prints a Deduper's health report. It normalizes and
// hashes a message key with the library's own code.
//
// Usage:
//
//	dedupctl lookup -redis ADDR|URL -handler NAME [-former NAMES] KEY...
//	dedupctl forget -redis ADDR|URL -handler NAME [-former NAMES] [-force] KEY...
//	dedupctl count  -redis ADDR|URL [-handler NAME]
//	dedupctl health -redis ADDR|URL
//
// Every command takes -redis or -redis-cluster (an address or a redis[s]:// URL) and
// redis-cli's connection flags; "dedupctl -h" lists them all, and docs/operating.md
// describes the output and the exit codes.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
)

const usage = `dedupctl looks up, forgets and counts dedupkit records in Redis.

Usage:
  dedupctl lookup -redis ADDR|URL -handler NAME [-former NAMES] KEY...
  dedupctl forget -redis ADDR|URL -handler NAME [-former NAMES] [-force] KEY...
  dedupctl count  -redis ADDR|URL [-handler NAME]
  dedupctl health -redis ADDR|URL

Flags may come before or after the keys; a key that begins with "-" goes after "--".

Connecting (as redis-cli does; a flag overrides the URL's part):
  -redis ADDR|URL         host:port, or redis[s]://[USER[:PASSWORD]@]HOST[:PORT][/DB]
                          (rediss: TLS)
  -redis-cluster ADDRS|URL
                          host:port,host:port,..., or
                          redis[s]://[USER[:PASSWORD]@]HOST[:PORT]?addr=HOST:PORT&...
  -user NAME              ACL user
  -pass PASSWORD          password; REDISCLI_AUTH gives it when neither -pass nor the
                          URL does (a flag shows in ps)
  -db N                   database number (not on a Cluster)
  -tls                    connect with TLS
  -cacert FILE            trust the CAs in this PEM file instead of the system's
  -cert FILE, -key FILE   client certificate and key, PEM (mutual TLS)
  -sni NAME               server name to ask for and verify (default: the host)
  -insecure               do not verify the server's certificate

Every command also takes -prefix P (default dedup), -json and -timeout D (default
10s: it bounds the whole command). "dedupctl COMMAND -h" lists a command's flags.

Exit codes: 0 done, 1 operational error (Redis unreachable, failing or not answering
within -timeout; health fail), 2 usage error (bad flags, a bad URL or certificate
file, a bad or unknown handler, a missing key), 3 not found, 4 refused (forget of a
record IN PROGRESS without -force; a key holding a value dedup did not write).
`

func main() {
	redis.SetLogger(quietRedis{}) // its dial retries; dedupctl says what failed itself
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// run runs one command and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmds := map[string]func(context.Context, *command) int{
		"lookup": lookup, "forget": forget, "count": count, "health": health,
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fn, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "dedupctl: unknown command %q (lookup, forget, count or health)\n", args[0])
		return exitUsage
	}
	c := &command{name: args[0], stdout: stdout, stderr: stderr}
	if code, ok := c.parse(args[1:]); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return fn(ctx, c)
}

// command is one run: its flags, and what it writes to.
type command struct {
	name           string
	stdout, stderr io.Writer

	redis, cluster, prefix, handler, former string
	force, json                             bool
	timeout                                 time.Duration
	keys                                    []string

	// connection flags
	user, pass, cacert, cert, key, sni string
	db                                 int
	tls, insecure                      bool
	set                                map[string]bool // the flags given

	// what parse made of them
	opts        *redis.Options        // -redis
	clusterOpts *redis.ClusterOptions // -redis-cluster
	addr        string                // where, for messages: never with a password
}

// parse reads the flags and arguments; ok is false when the run ends there, with code.
func (c *command) parse(args []string) (code int, ok bool) {
	fs := flag.NewFlagSet("dedupctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.StringVar(&c.redis, "redis", "", "one Redis server, `ADDR|URL`: host:port, or redis[s]://[USER[:PASSWORD]@]HOST[:PORT][/DB] (rediss: TLS)")
	fs.StringVar(&c.cluster, "redis-cluster", "", "a Redis Cluster, `ADDRS|URL`: host:port,host:port,..., or redis[s]://[USER[:PASSWORD]@]HOST[:PORT]?addr=HOST:PORT&...")
	fs.StringVar(&c.user, "user", "", "the ACL user `name`")
	fs.StringVar(&c.pass, "pass", "", "the `password` (shows in ps: prefer the environment variable REDISCLI_AUTH, used when neither -pass nor the URL gives one)")
	fs.IntVar(&c.db, "db", 0, "the database `number` (not on a Cluster)")
	fs.BoolVar(&c.tls, "tls", false, "connect with TLS (as a rediss:// URL does)")
	fs.StringVar(&c.cacert, "cacert", "", "trust the CAs in this PEM `file` instead of the system's (TLS)")
	fs.StringVar(&c.cert, "cert", "", "a client certificate, PEM `file`, for mutual TLS (with -key)")
	fs.StringVar(&c.key, "key", "", "the client certificate's private key, PEM `file` (with -cert)")
	fs.StringVar(&c.sni, "sni", "", "the server `name` to ask for and verify (TLS; default: the host)")
	fs.BoolVar(&c.insecure, "insecure", false, "do not verify the server's certificate (TLS)")
	fs.StringVar(&c.prefix, "prefix", dedup.DefaultPrefix, "the Deduper's key `prefix` (dedup.WithPrefix)")
	fs.BoolVar(&c.json, "json", false, "print one JSON document on stdout")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "give up after this long: it bounds the whole command (connecting, every call, every retry)")
	keyed := c.name == "lookup" || c.name == "forget"
	if keyed || c.name == "count" {
		fs.StringVar(&c.handler, "handler", "", "the handler's `name`")
	}
	if keyed {
		fs.StringVar(&c.former, "former", "", "the handler's former `names`, comma-separated (dedup.WithFormerNames)")
	}
	if c.name == "forget" {
		fs.BoolVar(&c.force, "force", false, "forget a record IN PROGRESS too (dangerous: its owner is running it and will find its lease lost)")
	}
	flags, positional := splitArgs(fs, args)
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	c.keys = append(fs.Args(), positional...)
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	switch {
	case c.redis == "" && c.cluster == "":
		return c.usageErr("-redis or -redis-cluster is required")
	case c.redis != "" && c.cluster != "":
		return c.usageErr("-redis and -redis-cluster exclude each other")
	case c.timeout <= 0:
		return c.usageErr("-timeout must be positive")
	case keyed && c.handler == "":
		return c.usageErr("-handler is required")
	case keyed && len(c.keys) == 0:
		return c.usageErr("missing key: give the message key(s) to " + c.name)
	case !keyed && len(c.keys) > 0:
		return c.usageErr(fmt.Sprintf("%s takes no arguments, got %q", c.name, c.keys))
	}
	for _, k := range c.keys {
		if k == "" {
			return c.usageErr("missing key: an empty key has no record")
		}
	}
	if err := c.connection(); err != nil {
		return c.usageErr(err.Error())
	}
	return 0, true
}

// splitArgs separates flags from positional arguments, so that flags may follow the
// keys (package flag stops at the first positional one). An unknown flag is left for
// fs.Parse to refuse; everything after "--" is positional.
func splitArgs(fs *flag.FlagSet, args []string) (flags, positional []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return flags, append(positional, args[i+1:]...)
		case len(a) < 2 || a[0] != '-':
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimPrefix(a[1:], "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !(ok && b.IsBoolFlag()) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, positional
}

// connection makes the go-redis options of the connection flags, with -timeout as
// every timeout. An error is a usage error; it never holds the password.
func (c *command) connection() error {
	if c.cluster != "" {
		if c.set["db"] && c.db != 0 {
			return errors.New("-db: a Redis Cluster has database 0 only")
		}
		var o *redis.ClusterOptions
		if isURL(c.cluster) {
			u, err := url.Parse(c.cluster)
			if err != nil {
				return fmt.Errorf("-redis-cluster: %w", urlErr(err))
			}
			if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
				return fmt.Errorf("-redis-cluster: a Redis Cluster has database 0 only, the URL names %q", db)
			}
			if o, err = redis.ParseClusterURL(c.cluster); err != nil {
				return fmt.Errorf("-redis-cluster: %w", urlErr(err))
			}
		} else {
			o = &redis.ClusterOptions{Addrs: strings.Split(c.cluster, ",")}
		}
		c.auth(&o.Username, &o.Password)
		var err error
		if o.TLSConfig, err = c.tlsConfig(o.TLSConfig, o.Addrs[0]); err != nil {
			return err
		}
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = c.timeout, c.timeout, c.timeout, c.timeout
		o.ContextTimeoutEnabled = true
		if o.MaxRetries == 0 {
			o.MaxRetries = 1
		}
		if o.DialerRetries == 0 {
			o.DialerRetries = 1
		}
		if o.MaxRedirects == 0 {
			o.MaxRedirects = 3
		}
		c.clusterOpts, c.addr = o, strings.Join(o.Addrs, ",")
		return nil
	}
	o := &redis.Options{Addr: c.redis}
	if isURL(c.redis) {
		var err error
		if o, err = redis.ParseURL(c.redis); err != nil {
			return fmt.Errorf("-redis: %w", urlErr(err))
		}
	}
	c.auth(&o.Username, &o.Password)
	if c.set["db"] {
		if c.db < 0 {
			return errors.New("-db must not be negative")
		}
		o.DB = c.db
	}
	var err error
	if o.TLSConfig, err = c.tlsConfig(o.TLSConfig, o.Addr); err != nil {
		return err
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = c.timeout, c.timeout, c.timeout, c.timeout
	o.ContextTimeoutEnabled = true // else go-redis reads with ReadTimeout, whatever the deadline
	if o.MaxRetries == 0 {
		o.MaxRetries = 1
	}
	if o.DialerRetries == 0 {
		o.DialerRetries = 1
	}
	c.opts, c.addr = o, o.Addr
	return nil
}

func isURL(s string) bool { return strings.Contains(s, "://") }

// urlErr drops the URL from a url.Error: it may hold a password.
func urlErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// auth applies -user and -pass over the URL's, else REDISCLI_AUTH's password.
func (c *command) auth(user, pass *string) {
	if c.set["user"] {
		*user = c.user
	}
	if c.set["pass"] {
		*pass = c.pass
	} else if *pass == "" {
		*pass = os.Getenv("REDISCLI_AUTH")
	}
}

// tlsConfig returns base (a rediss:// URL's, or nil) with the TLS flags applied, a
// new one under -tls, or nil without TLS.
func (c *command) tlsConfig(base *tls.Config, addr string) (*tls.Config, error) {
	if base == nil && !c.tls {
		for _, f := range []string{"cacert", "cert", "key", "sni", "insecure"} {
			if c.set[f] {
				return nil, fmt.Errorf("-%s needs -tls or a rediss:// URL", f)
			}
		}
		return nil, nil
	}
	if base == nil {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		base = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	if c.sni != "" {
		base.ServerName = c.sni
	}
	base.InsecureSkipVerify = base.InsecureSkipVerify || c.insecure
	if c.cacert != "" {
		pem, err := os.ReadFile(c.cacert)
		if err != nil {
			return nil, fmt.Errorf("-cacert: %w", err)
		}
		base.RootCAs = x509.NewCertPool()
		if !base.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-cacert: no PEM certificate in %s", c.cacert)
		}
	}
	if (c.cert == "") != (c.key == "") {
		return nil, errors.New("-cert and -key go together")
	}
	if c.cert != "" {
		pair, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return nil, fmt.Errorf("-cert, -key: %w", err)
		}
		base.Certificates = []tls.Certificate{pair}
	}
	return base, nil
}

func (c *command) usageErr(msg string) (int, bool) {
	fmt.Fprintf(c.stderr, "dedupctl %s: %s (dedupctl %s -h for help)\n", c.name, msg, c.name)
	return exitUsage, false
}

func (c *command) errorf(format string, args ...any) {
	fmt.Fprintf(c.stderr, "dedupctl %s: "+format+"\n", append([]any{c.name}, args...)...)
}

// failed reports an operational error (exit 1), saying so when -timeout ran out.
func (c *command) failed(ctx context.Context, err error, format string, args ...any) int {
	msg := fmt.Sprintf(format, args...)
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		// the client's own timeouts equal -timeout: they may fire just before ctx's
		c.errorf("%sno answer within -timeout %v (%v)", msg, c.timeout, err)
	} else {
		c.errorf("%s%v", msg, err)
	}
	return exitFailed
}

// deduper returns a Deduper on Redis with the command's handler registered without a
// local tier (so with no notice subscription); code is not 0 on failure.
func (c *command) deduper(ctx context.Context) (d *dedup.Deduper, h *dedup.Handler, done func(), code int) {
	return c.deduperPing(ctx, true)
}

// deduperPing is deduper, PINGing first if ping (health reports its own failure).
func (c *command) deduperPing(ctx context.Context, ping bool) (d *dedup.Deduper, h *dedup.Handler, done func(), code int) {
	var rdb redis.UniversalClient
	if c.clusterOpts != nil {
		rdb = redis.NewClusterClient(c.clusterOpts)
	} else {
		rdb = redis.NewClient(c.opts)
	}
	if ping {
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, nil, nil, c.failed(ctx, err, "cannot reach Redis at %s: ", c.addr)
		}
	}
	store, err := redisstore.New(rdb)
	if err == nil {
		d, err = dedup.New(store, dedup.WithPrefix(c.prefix), dedup.WithLogger(slog.New(slog.DiscardHandler)))
	}
	if err != nil {
		rdb.Close()
		c.errorf("%v", err)
		return nil, nil, nil, exitUsage
	}
	done = func() {
		d.Close()
		rdb.Close()
	}
	if c.handler == "" {
		return d, nil, done, 0
	}
	opts := []dedup.HandlerOption{dedup.WithLocalCache(0, 0)}
	if c.former != "" {
		opts = append(opts, dedup.WithFormerNames(strings.Split(c.former, ",")...))
	}
	if h, err = d.Register(c.handler, opts...); err != nil {
		done()
		c.errorf("%v", err)
		return nil, nil, nil, exitUsage
	}
	return d, h, done, 0
}

// known reports whether a process runs the handler (subscribed to its notices) or a
// record has its name. An error counts as known: it is not the operator's to fix.
func known(ctx context.Context, d *dedup.Deduper, h *dedup.Handler) bool {
	if n, err := h.Subscribers(ctx); err != nil || n > 0 {
		return true
	}
	counts, err := d.CountRecords(ctx, h.Name())
	return err != nil || counts[h.Name()] > 0
}

func (c *command) unknownHandler() int {
	c.errorf("unknown handler %q: no process runs it (with a local tier) and it has no record under prefix %q; check -handler and -prefix",
		c.handler, c.prefix)
	return exitUsage
}

// record is one key's record, as printed.
type record struct {
	Key         string `json:"key"`
	Name        string `json:"name"`
	RecordKey   string `json:"record_key"`
	State       string `json:"state"`
	Owner       string `json:"owner,omitempty"`
	TTLMillis   int64  `json:"ttl_ms"`
	Fingerprint string `json:"fingerprint,omitempty"`
	ReplySize   int    `json:"reply_size"`
	HasReply    bool   `json:"has_reply"`
	Deleted     *bool  `json:"deleted,omitempty"`
	Notified    *int   `json:"notified,omitempty"`
	Error       string `json:"error,omitempty"`
}

func recordOf(key string, info dedup.RecordInfo, err error) record {
	r := record{Key: key, Name: info.Handler, RecordKey: info.RecordKey, State: info.State.String(), Owner: info.Owner,
		TTLMillis: info.TTL.Milliseconds(), Fingerprint: info.Fingerprint, ReplySize: info.ReplySize,
		HasReply: info.HasReply}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

func (c *command) printRecord(r record) {
	w := c.stdout
	switch {
	case r.Error != "" && r.State == driver.RecordAbsent.String():
		fmt.Fprintf(w, "%s: error: %s\n", r.Key, r.Error)
		return
	case r.State == driver.RecordAbsent.String():
		fmt.Fprintf(w, "%s: no record under %s (%s)\n", r.Key, r.Name, r.RecordKey)
	default:
		fmt.Fprintf(w, "%s: %s under %s, %v left\n", r.Key, strings.ToUpper(strings.ReplaceAll(r.State, "-", " ")), r.Name,
			(time.Duration(r.TTLMillis) * time.Millisecond).String())
		fmt.Fprintf(w, "  record key   %s\n  owner        %s\n", r.RecordKey, r.Owner)
		fmt.Fprintf(w, "  fingerprint  %s\n  reply        %s\n", orNone(r.Fingerprint), replyOf(r.HasReply, r.ReplySize))
	}
	if r.Deleted != nil {
		if *r.Deleted {
			fmt.Fprintf(w, "  forgotten: the key runs again when it comes; forget notice sent to %d subscribed process(es)\n", *r.Notified)
		} else if r.Error == "" {
			fmt.Fprintf(w, "  nothing to delete; forget notice sent to %d subscribed process(es) all the same\n", *r.Notified)
		}
	}
	if r.Error != "" {
		fmt.Fprintf(w, "  not forgotten: %s\n", r.Error)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// replyOf describes a stored reply by its size; its bytes are never printed.
func replyOf(has bool, n int) string {
	if !has {
		return "none"
	}
	return fmt.Sprintf("%d bytes", n)
}

func (c *command) printJSON(v any) {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func lookup(ctx context.Context, c *command) int {
	d, h, done, code := c.deduper(ctx)
	if code != 0 {
		return code
	}
	defer done()
	infos, err := h.LookupMany(ctx, c.keys)
	if err != nil {
		return c.failed(ctx, err, "")
	}
	out := make([]record, len(infos))
	code, absent := exitOK, 0
	for i, info := range infos {
		out[i] = recordOf(c.keys[i], info, info.Err)
		switch {
		case errors.Is(info.Err, dedup.ErrBadRecord): // an answer, not an outage
			out[i].Error += notOurs
			if code != exitFailed {
				code = exitRefused
			}
		case info.Err != nil:
			code = exitFailed
		case info.State == driver.RecordAbsent:
			absent++
		}
	}
	if absent == len(infos) && !known(ctx, d, h) {
		return c.unknownHandler()
	}
	if absent > 0 && code == exitOK {
		code = exitNotFound
	}
	if c.json {
		c.printJSON(struct {
			Prefix  string   `json:"prefix"`
			Handler string   `json:"handler"`
			Records []record `json:"records"`
		}{c.prefix, c.handler, out})
	} else {
		for _, r := range out {
			c.printRecord(r)
		}
	}
	return code
}

// notOurs follows the error of a key holding a value dedup did not write (ErrBadRecord).
const notOurs = "; the key holds a value dedup did not write: left alone (not a store failure)"

func forget(ctx context.Context, c *command) int {
	d, h, done, code := c.deduper(ctx)
	if code != 0 {
		return code
	}
	defer done()
	var opts []dedup.ForgetOption
	if c.force {
		opts = append(opts, dedup.ForgetInProgress())
	}
	out := make([]record, len(c.keys))
	worst := func(a, b int) int { // 1, then 4, then 3, then 0
		rank := map[int]int{exitOK: 0, exitNotFound: 1, exitRefused: 2, exitFailed: 3}
		if rank[b] > rank[a] {
			return b
		}
		return a
	}
	code, absent := exitOK, 0
	for i, key := range c.keys {
		info, err := h.Forget(ctx, key, opts...)
		r := recordOf(key, info, err)
		deleted, notified := err == nil && info.State != driver.RecordAbsent, info.Notified
		r.Deleted, r.Notified = &deleted, &notified
		switch {
		case errors.Is(err, dedup.ErrRecordInProgress):
			r.Error += "; -force forgets it, at the cost of its owner's lease (a run that succeeds all the same writes DONE)"
			code = worst(code, exitRefused)
		case errors.Is(err, dedup.ErrBadRecord): // left alone, as the store does
			r.Error += notOurs
			code = worst(code, exitRefused)
		case err != nil:
			code = worst(code, exitFailed)
		case info.State == driver.RecordAbsent:
			absent++
			code = worst(code, exitNotFound)
		}
		out[i] = r
	}
	if absent == len(c.keys) && !known(ctx, d, h) {
		return c.unknownHandler()
	}
	if c.json {
		c.printJSON(struct {
			Prefix    string   `json:"prefix"`
			Handler   string   `json:"handler"`
			Forgotten []record `json:"forgotten"`
		}{c.prefix, c.handler, out})
	} else {
		for _, r := range out {
			c.printRecord(r)
		}
	}
	return code
}

func count(ctx context.Context, c *command) int {
	d, h, done, code := c.deduper(ctx) // h: -handler's, to ask who runs it
	if code != 0 {
		return code
	}
	defer done()
	counts, err := d.CountRecords(ctx, c.handler)
	if err != nil {
		return c.failed(ctx, err, "")
	}
	if h != nil && counts[c.handler] == 0 {
		if n, err := h.Subscribers(ctx); err == nil && n == 0 {
			return c.unknownHandler()
		}
		counts[c.handler] = 0
	}
	var total int64
	names := make([]string, 0, len(counts))
	for n, k := range counts {
		names = append(names, n)
		total += k
	}
	sort.Strings(names)
	if c.json {
		c.printJSON(struct {
			Prefix string           `json:"prefix"`
			Counts map[string]int64 `json:"counts"`
			Total  int64            `json:"total"`
		}{c.prefix, counts, total})
		return exitOK
	}
	for _, n := range names {
		fmt.Fprintf(c.stdout, "%-24s %d\n", n, counts[n])
	}
	fmt.Fprintf(c.stdout, "%-24s %d\n", "total", total)
	return exitOK
}

func health(ctx context.Context, c *command) int {
	d, _, done, code := c.deduperPing(ctx, false) // an unreachable Redis is a failed check
	if code != 0 {
		return code
	}
	defer done()
	rep := d.Health(ctx)
	if c.json {
		c.printJSON(rep)
	} else {
		fmt.Fprintf(c.stdout, "status: %s\n", rep.Status)
		for _, ch := range rep.Checks {
			line := fmt.Sprintf("  %-24s %-7s", ch.Name, ch.Status)
			if ch.Server != "" {
				line += " " + ch.Server
			}
			if ch.Value != "" {
				line += " " + ch.Value
			}
			if ch.Latency > 0 {
				line += " " + ch.Latency.Round(time.Microsecond).String()
			}
			if ch.Detail != "" {
				line += ": " + ch.Detail
			}
			fmt.Fprintln(c.stdout, line)
		}
	}
	if rep.Status == driver.HealthFail {
		return exitFailed
	}
	return exitOK
}
