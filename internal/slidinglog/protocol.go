package slidinglog

import (
	"errors"
	"fmt"
	"time"
)

// ErrUnexpectedReply is returned (wrapped) when Redis answers the library
// with a reply of the wrong shape (redisstore.ErrUnexpectedReply).
var ErrUnexpectedReply = errors.New("ratelimit: unexpected reply from Redis")

// Kind is how a limit counts (see lua/exact.lua and lua/buckets.lua).
type Kind uint8

const (
	// ExactLog logs every unit of cost with its time.
	ExactLog Kind = 1
	// Buckets counts cost per bucket of time.
	Buckets Kind = 2
	// InFlight counts the requests in flight (lua/inflight.lua): a
	// sorted set of holder ids, each with the end of its lease. Its
	// Window is the lease; its unit field carries the request's holder
	// id (SetHolder), not a time unit; it takes no Name and no Block.
	InFlight Kind = 3
	// Calendar counts a quota per calendar period (lua/calendar.lua): a
	// string of the period's start and end, its count and how many times
	// forget cleared it. Its Window is
	// the longest period, its Unit 1µs; each request carries the bounds
	// of its periods after its fields (SetPeriods); it takes no Name
	// and no Lease.
	Calendar Kind = 5
	// GCRA is a token bucket (lua/gcra.lua): its Quota is the burst, its
	// Unit the emission interval (a unit of cost drains every Unit), its
	// Window the time the whole burst takes to drain (Quota*Unit). It
	// takes no Name and no Lease.
	GCRA Kind = 4
)

// periodBytes is the bounds a Calendar limit carries in each request:
// four times.
const periodBytes = 4 * timeBytes

// MaxHolder is the largest holder id the wire format carries: holder ids
// of in-flight limits are 1 to MaxHolder.
const MaxHolder = 1<<(8*windowBytes) - 1

// Flags of a limit.
const (
	flagShadow  = 1
	flagBlock   = 2 // a block duration (windowBytes) follows the name
	flagLease   = 4 // the lease's length (windowBytes) follows the block's
	flagAcquire = 8 // the units a lease asks for (quotaBytes) follow the lease's length
)

// MaxBlock is the longest block the wire format carries.
const MaxBlock = time.Duration(1<<(8*windowBytes)-1) * time.Microsecond

// Field widths of the wire format, in bytes (see lua/codec.lua).
const (
	timeBytes   = 7
	costBytes   = 4
	quotaBytes  = 4
	windowBytes = 6
	nameMax     = 255
	// requestHead is a request's bytes before its limits: time, cost and
	// the number of limits.
	requestHead = timeBytes + costBytes + 1
	maxLimits   = 255
	// maxWindowUnits is the most units an exact log's window spans: its
	// entries' offsets (2 bytes, at most 65535 units after the log's base,
	// lua/exact.lua) must hold a window and the base's rounding.
	maxWindowUnits = 16384
)

// A Limit is what the Lua code needs of one limit.
type Limit struct {
	Kind   Kind
	Shadow bool // reported, never denies
	Quota  int
	Window time.Duration
	// Unit is the exact log's time unit, the buckets' precision.
	Unit time.Duration
	// Name is a bucketed limit's name: its fields in the hash start with it.
	Name string
	// Block, if not 0, is how long the limit blocks a client once it
	// denies it a request it has no room for (rounded up to the
	// millisecond): its request then carries one more key, the block key,
	// after the keys of its limits (see lua/codec.lua).
	Block time.Duration
	// Lease, if not 0, lets the exact log lend leases of that length at
	// most (see lua/exact.lua): every request of the limit carries it,
	// since it changes which entries a decision counts.
	Lease time.Duration
	// Acquire makes a request of the limit ask for a lease (it needs
	// Lease): the units it asks for are set in each request (SetAcquire).
	Acquire bool
}

// Specs is limits encoded for requests, once.
type Specs struct {
	n      int
	blocks int // limits with a block duration
	b      []byte
}

// Len returns the number of limits.
func (s Specs) Len() int { return s.n }

// Blocks returns the number of limits that block: the request's block
// keys, which follow its limits' keys.
func (s Specs) Blocks() int { return s.blocks }

// Encode encodes limits for requests. It reports a limit the wire format
// cannot carry.
func Encode(limits ...Limit) (Specs, error) {
	if len(limits) > maxLimits {
		return Specs{}, fmt.Errorf("%d limits: at most %d", len(limits), maxLimits)
	}
	var b []byte
	var s Specs
	for _, l := range limits {
		if l.Kind == InFlight {
			if err := checkInFlight(l); err != nil {
				return Specs{}, err
			}
		}
		if l.Kind == GCRA && (l.Name != "" || l.Lease != 0) {
			return Specs{}, fmt.Errorf("token bucket with a name %q or a lease %v", l.Name, l.Lease)
		}
		switch {
		case l.Kind != ExactLog && l.Kind != Buckets && l.Kind != InFlight && l.Kind != GCRA && l.Kind != Calendar:
			return Specs{}, fmt.Errorf("unknown kind %d", l.Kind)
		case l.Quota < 1 || l.Quota >= maxCost: // a clamped cost must never fit
			return Specs{}, fmt.Errorf("quota %d out of range", l.Quota)
		case l.Window.Microseconds() < 1 || l.Window.Microseconds() >= 1<<(8*windowBytes):
			return Specs{}, fmt.Errorf("window %v out of range", l.Window)
		case l.Kind != InFlight && (l.Unit.Microseconds() < 1 || l.Unit > l.Window):
			return Specs{}, fmt.Errorf("unit %v out of range", l.Unit)
		case l.Kind == ExactLog && l.Window.Microseconds()/l.Unit.Microseconds() > maxWindowUnits:
			return Specs{}, fmt.Errorf("window %v of %d units of %v: an exact log's window is at most %d units", l.Window,
				l.Window.Microseconds()/l.Unit.Microseconds(), l.Unit, maxWindowUnits)
		case l.Kind == Buckets && (l.Name == "" || len(l.Name) > nameMax):
			return Specs{}, fmt.Errorf("bucketed limit name of %d bytes: want 1 to %d", len(l.Name), nameMax)
		case l.Block < 0 || l.Block > MaxBlock || l.Block > 0 && l.Shadow:
			return Specs{}, fmt.Errorf("block %v (shadow %v) out of range", l.Block, l.Shadow)
		case l.Kind == Calendar && (l.Name != "" || l.Acquire):
			return Specs{}, fmt.Errorf("calendar limit with a name %q or a lease", l.Name)
		case l.Lease < 0 || l.Lease > 0 && (l.Kind != ExactLog || l.Shadow || l.Block > 0 || l.Lease < l.Unit || l.Lease > l.Window):
			return Specs{}, fmt.Errorf("lease %v of a limit of kind %d (window %v, unit %v, shadow %v, block %v)", l.Lease, l.Kind, l.Window, l.Unit, l.Shadow, l.Block)
		case l.Acquire && l.Lease == 0:
			return Specs{}, fmt.Errorf("a lease asked of a limit that lends none")
		}
		flags := byte(0)
		if l.Shadow {
			flags |= flagShadow
		}
		block := (l.Block + time.Microsecond - 1) / time.Microsecond
		if block > 0 {
			flags |= flagBlock
		}
		lease := uint64((l.Lease + time.Microsecond - 1) / time.Microsecond)
		if lease > 0 {
			flags |= flagLease
		}
		if l.Acquire {
			flags |= flagAcquire
		}
		b = append(b, byte(l.Kind), flags)
		b = appendUint(b, uint64(l.Quota), quotaBytes)
		b = appendUint(b, uint64(l.Window.Microseconds()), windowBytes)
		unit := uint64(l.Unit.Microseconds())
		if l.Kind == InFlight {
			unit = 0 // the holder id, which SetHolder writes in each request
		}
		b = appendUint(b, unit, windowBytes)
		name := ""
		if l.Kind == Buckets {
			name = l.Name
		}
		b = append(b, byte(len(name)))
		b = append(b, name...)
		if block > 0 {
			b = appendUint(b, uint64(block), windowBytes)
			s.blocks++
		}
		if lease > 0 {
			b = appendUint(b, lease, windowBytes)
		}
		if l.Acquire {
			b = appendUint(b, 0, quotaBytes) // SetAcquire's
		}
		if l.Kind == Calendar {
			b = append(b, make([]byte, periodBytes)...) // SetPeriods'
		}
	}
	s.n, s.b = len(limits), b
	return s, nil
}

// Join returns the specs of several groups of limits, in turn.
func Join(specs ...Specs) Specs {
	var s Specs
	for _, x := range specs {
		s.n += x.n
		s.blocks += x.blocks
		s.b = append(s.b, x.b...)
	}
	return s
}

// AppendRequest appends to dst a request of cost at now over the limits of
// specs. now is in Unix microseconds; 0 uses the Redis server's clock.
func AppendRequest(dst []byte, now int64, cost int, s Specs) []byte {
	dst = appendUint(dst, uint64(now), timeBytes)
	dst = appendUint(dst, uint64(min(cost, maxCost)), costBytes)
	dst = append(dst, byte(s.n))
	return append(dst, s.b...)
}

// SetQuotas sets the quota of each limit of req, a request AppendRequest
// appended, to quota(j) for its j-th limit. The quotas must be ones Encode
// accepts.
func SetQuotas(req []byte, quota func(j int) int) {
	at := requestHead
	for j := range int(req[requestHead-1]) {
		putUint(req[at+2:at+2+quotaBytes], uint64(quota(j)))
		at = specEnd(req, at)
	}
}

// specEnd returns where the limit at byte at of req ends: its head, its
// name, and the fields its flags say follow.
func specEnd(req []byte, at int) int {
	next := at + specHead + int(req[at+specHead-1])
	if req[at+1]&flagBlock != 0 {
		next += windowBytes
	}
	if req[at+1]&flagLease != 0 {
		next += windowBytes
	}
	if req[at+1]&flagAcquire != 0 {
		next += quotaBytes
	}
	if Kind(req[at]) == Calendar {
		next += periodBytes
	}
	return next
}

// SetPeriods writes into each Calendar limit of req, a request
// AppendRequest appended, the bounds of its periods, bounds(j) for its
// j-th limit: the previous period's start, the current one's, its end,
// the next one's end (Unix µs, ascending, below 1<<56). The Lua code
// decides in the period that holds the request's time, and fails the
// request if none does.
func SetPeriods(req []byte, bounds func(j int) [4]int64) {
	at := requestHead
	for j := range int(req[requestHead-1]) {
		end := specEnd(req, at)
		if Kind(req[at]) == Calendar {
			b := bounds(j)
			for k, v := range b {
				putUint(req[end-periodBytes+k*timeBytes:end-periodBytes+(k+1)*timeBytes], uint64(max(v, 0)))
			}
		}
		at = end
	}
}

// SetAcquire sets the units the limits of req that ask for a lease
// (Limit.Acquire) ask for: at least the request's cost, at most the
// limit's quota (the Lua code lends min(units, room), and admits nothing
// without room for the cost).
func SetAcquire(req []byte, units int) {
	at := requestHead
	for range int(req[requestHead-1]) {
		end := specEnd(req, at)
		if req[at+1]&flagAcquire != 0 {
			putUint(req[end-quotaBytes:end], uint64(units))
		}
		at = end
	}
}

// SetHolder writes id, the request's holder id (1 to MaxHolder), into
// every in-flight limit of req, a request AppendRequest appended: the
// Lua code logs the request in an in-flight limit under that id, and
// admits no request of an in-flight limit whose holder id is 0.
func SetHolder(req []byte, id uint64) {
	at := requestHead
	for range int(req[requestHead-1]) {
		if Kind(req[at]) == InFlight {
			putUint(req[at+2+quotaBytes+windowBytes:at+2+quotaBytes+2*windowBytes], id)
		}
		at = specEnd(req, at)
	}
}

// checkInFlight reports what an in-flight limit has that it cannot: a
// name, a unit, a block.
func checkInFlight(l Limit) error {
	switch {
	case l.Name != "":
		return fmt.Errorf("in-flight limit with a name %q", l.Name)
	case l.Unit != 0:
		return fmt.Errorf("in-flight limit with a unit %v", l.Unit)
	case l.Block != 0:
		return fmt.Errorf("in-flight limit with a block %v", l.Block)
	}
	return nil
}

// AppendHolders appends the holder ids ids, 6 bytes each, for Renew.
func AppendHolders(dst []byte, ids []uint64) []byte {
	for _, id := range ids {
		dst = appendUint(dst, id, windowBytes)
	}
	return dst
}

// specHead is a limit's bytes before its name: kind, flags, quota, window,
// unit and the name's length.
const specHead = 2 + quotaBytes + 2*windowBytes + 1

// putUint writes v into b, big-endian.
func putUint(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// maxCost is the largest cost a request carries: a larger one is sent as
// maxCost, which exceeds every quota (Encode refuses quotas from maxCost
// up), so it is denied all the same.
const maxCost = 1<<(8*costBytes) - 1

// AppendStamps appends the times of a request's entries in each limit (0
// where it was not logged), for Rollback.
func AppendStamps(dst []byte, stamps []int64) []byte {
	for _, s := range stamps {
		dst = appendUint(dst, uint64(max(s, 0)), timeBytes)
	}
	return dst
}

// ParseStamps decodes raw, the reply of charge (7 bytes per limit), into
// the times of n limits' entries (0 where none was logged).
func ParseStamps(raw any, n int) ([]int64, error) {
	s, ok := raw.(string)
	if !ok || len(s) != timeBytes*n {
		return nil, fmt.Errorf("%w: %T of %d bytes for the stamps of %d limits", ErrUnexpectedReply, raw, len(s), n)
	}
	out := make([]int64, n)
	for i := range out {
		var v int64
		for _, c := range []byte(s[timeBytes*i : timeBytes*(i+1)]) {
			v = v<<8 | int64(c)
		}
		out[i] = v
	}
	return out, nil
}

func appendUint(b []byte, v uint64, width int) []byte {
	for i := width - 1; i >= 0; i-- {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// Reply is the Lua code's answer to one request.
type Reply struct {
	Allowed bool  // admitted, and logged in every limit with room
	Denied  int   // the limit that denied the request, from 0; -1 if none
	Now     int64 // the request's time, in Unix microseconds: its own, or the Redis server's
}

// LimitReply is one limit's part of a Reply. A limit is decided at its
// log's time: the request's, or the latest time its log logged at if that
// is later (a log's time never runs backwards, see lua/exact.lua); Reset and
// Stamp are in the log's time, so never earlier than the request's.
type LimitReply struct {
	// Count is the cost the limit had logged in its window before the
	// request.
	Count int64
	// Reset is when the limit next matters: if it has no room for the
	// request, when the request fits (0: never, its cost exceeds the
	// quota); else when its oldest entry leaves the window, or, if it had
	// none, when the request's does if it was logged there, else the
	// log's time.
	Reset int64
	// Stamp is when the request was logged in the limit, if it was; else
	// when its oldest entry leaves the window (0 if it has none, and for a
	// shadow limit without room in an admitted request).
	Stamp int64
	// Block, if not 0, is when the limit's block of the client ends: the
	// limit denies the request, whatever its count (the Lua code replies
	// it as a stamp below 0).
	Block int64
}

// ReplyLen returns the length of the reply to a request of n limits: a
// flat array (see lua/codec.lua).
func ReplyLen(n int) int { return 3 + 3*n }

// A RequestError is a request's failure in Redis that failed it alone: the
// other requests of its call were decided (see lua/codec.lua). Its
// message is the error's, as Lua raised it: a Redis error reply's
// (WRONGTYPE..., OOM..., NOPERM...) or the library's own (a key that holds
// no log).
type RequestError struct {
	Msg string
	// Left is how many units of cost the request left logged: it failed
	// after logging them, and they could not be removed. Usually 0.
	Left int64
}

func (e *RequestError) Error() string { return e.Msg }

// RedisError marks a RequestError as an error Redis replied (see
// redis.Error): about the request, not about Redis's health.
func (e *RequestError) RedisError() {}

// ParseReply decodes raw, the reply to one request of len(limits) limits,
// into limits. A request that failed in Redis returns a *RequestError.
func ParseReply(raw any, limits []LimitReply) (Reply, error) {
	arr, ok := raw.([]any)
	if !ok || len(arr) != ReplyLen(len(limits)) {
		return Reply{}, fmt.Errorf("%w: %T of length %d for %d limits", ErrUnexpectedReply, raw, len(arr), len(limits))
	}
	if msg, ok := arr[0].(string); ok {
		left, ok := arr[1].(int64)
		if !ok || left < 0 {
			return Reply{}, fmt.Errorf("%w: failure %q with %v units left", ErrUnexpectedReply, msg, arr[1])
		}
		return Reply{}, &RequestError{Msg: msg, Left: left}
	}
	for i, e := range arr {
		// A stamp below 0 is a block's end (see LimitReply.Block).
		if v, ok := e.(int64); !ok || v < 0 && (i < 3 || i%3 != 2) {
			return Reply{}, fmt.Errorf("%w: element %d is %v", ErrUnexpectedReply, i, e)
		}
	}
	v := func(i int) int64 { return arr[i].(int64) }
	rep := Reply{Allowed: v(0) == 1, Denied: int(v(1)) - 1, Now: v(2)}
	if v(0) > 1 || rep.Denied >= len(limits) || rep.Allowed != (rep.Denied < 0) {
		return Reply{}, fmt.Errorf("%w: allowed=%d denied=%d", ErrUnexpectedReply, v(0), v(1))
	}
	for i := range limits {
		limits[i] = LimitReply{Count: v(3 + 3*i), Reset: v(4 + 3*i), Stamp: v(5 + 3*i)}
		if s := limits[i].Stamp; s < 0 {
			if rep.Allowed { // a block denies
				return Reply{}, fmt.Errorf("%w: limit %d blocks an admitted request", ErrUnexpectedReply, i)
			}
			limits[i].Stamp, limits[i].Block = 0, -s
		}
	}
	return rep, nil
}

// AppendReply appends to dst the reply rep with limits, as the Lua code
// gives it; tests stand in for Redis with it.
func AppendReply(dst []any, rep Reply, limits []LimitReply) []any {
	allowed := int64(0)
	if rep.Allowed {
		allowed = 1
	}
	dst = append(dst, allowed, int64(rep.Denied+1), rep.Now)
	for _, l := range limits {
		stamp := l.Stamp
		if l.Block != 0 {
			stamp = -l.Block
		}
		dst = append(dst, l.Count, l.Reset, stamp)
	}
	return dst
}

// RequestLimits returns the number of limits of req, a request
// AppendRequest appended (0 if it is too short to be one): the keys of
// its call are as many, then one per limit that blocks.
func RequestLimits(req []byte) int {
	if len(req) < requestHead {
		return 0
	}
	return int(req[requestHead-1])
}
