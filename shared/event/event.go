// Package event validates event bodies and makes the ids both halves of
// sluice use, so the origin and the edge agree on what an event is.
package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors Parse returns for a body that is not a JSON object; a bad field is
// a *FieldError instead.
var (
	ErrInvalidJSON = errors.New("event: body is not valid JSON (UTF-8)")
	ErrNotObject   = errors.New("event: body is not a JSON object")
)

// FieldError says which field of an event is wrong and why, so the API can
// answer with something the producer can fix.
type FieldError struct {
	Field  string
	Reason string
}

// Error returns "<field>: <reason>".
func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Malformed reports whether the field is missing, repeated or of the wrong
// JSON type (a request the API cannot read, 400) rather than a readable
// value it does not accept (422).
func (e *FieldError) Malformed() bool {
	switch e.Reason {
	case reasonRequired, reasonNotString, reasonRepeated:
		return true
	}
	return false
}

// Reasons a FieldError carries.
const (
	reasonRequired  = "is required"
	reasonNotString = "must be a string"
	reasonRepeated  = "must appear only once"
	reasonBadID     = "must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"
	reasonBadType   = "must be 1 to 128 characters of A-Z a-z 0-9 _ . : -"
)

const (
	maxIDLen   = 64
	maxTypeLen = 128
)

// ValidID reports whether s matches ^[A-Za-z0-9_.:-]{1,64}$, the form of ids
// clients may give (events, subscribers), which keeps them safe in URLs,
// headers and logs.
func ValidID(s string) bool { return validName(s, maxIDLen) }

// ValidType reports whether s is 1 to 128 characters of [A-Za-z0-9_.:-],
// the form of event types.
func ValidType(s string) bool { return validName(s, maxTypeLen) }

func validName(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '_' || c == '.' || c == ':' || c == '-'
}

// crockford is Crockford's base32 alphabet in lower case; it is in ASCII
// order, so encoded ids sort like the numbers they encode.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// NewID returns prefix + "_" + 26 lower-case Crockford base32 characters
// encoding 48 bits of now's Unix milliseconds followed by 80 bits read from
// r. Ids with one prefix therefore sort by creation time, so an index on them
// appends instead of splitting pages. r must not fail (crypto/rand.Reader
// never does); NewID panics if it does, rather than hand out a guessable id.
func NewID(prefix string, now time.Time, r io.Reader) string {
	var raw [16]byte
	ms := uint64(now.UnixMilli())
	for i := 0; i < 6; i++ {
		raw[i] = byte(ms >> (40 - 8*i))
	}
	if _, err := io.ReadFull(r, raw[6:]); err != nil {
		panic("event: reading random bytes for an id: " + err.Error())
	}

	// 26 characters hold 130 bits; the two leading bits are zero.
	hi := uint64(raw[0])<<56 | uint64(raw[1])<<48 | uint64(raw[2])<<40 | uint64(raw[3])<<32 |
		uint64(raw[4])<<24 | uint64(raw[5])<<16 | uint64(raw[6])<<8 | uint64(raw[7])
	lo := uint64(raw[8])<<56 | uint64(raw[9])<<48 | uint64(raw[10])<<40 | uint64(raw[11])<<32 |
		uint64(raw[12])<<24 | uint64(raw[13])<<16 | uint64(raw[14])<<8 | uint64(raw[15])
	b := make([]byte, len(prefix)+1+26)
	copy(b, prefix)
	b[len(prefix)] = '_'
	enc := b[len(prefix)+1:]
	for i := 25; i >= 0; i-- {
		enc[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(b)
}

// Parsed is an event body after validation.
type Parsed struct {
	ID   string
	Type string
	// Body is what subscribers receive: the input bytes, with the generated
	// "id" member inserted when the producer gave none.
	Body []byte
	// Generated reports whether ID was generated rather than given.
	Generated bool
}

// Parse validates one event body: a single JSON object with a "type" string
// passing ValidType and an optional "id" string passing ValidID. Member
// names are matched exactly, as a receiver's JSON parser would read them,
// and "id" and "type" may appear only once. When there is no "id", Parse
// calls newID and inserts `"id":"<id>",` right after the opening brace,
// leaving every other byte unchanged; otherwise Body is body itself.
func Parse(body []byte, newID func() string) (Parsed, error) {
	// JSON is UTF-8 (RFC 8259): json.Valid lets other bytes through in
	// strings, and a body stored and shown as it came would then break
	// every reader of the API.
	if !json.Valid(body) || !utf8.Valid(body) {
		return Parsed{}, ErrInvalidJSON
	}
	open := skipSpace(body, 0)
	if body[open] != '{' {
		return Parsed{}, ErrNotObject
	}
	rawID, rawType, err := topLevel(body, open)
	if err != nil {
		return Parsed{}, err
	}

	if rawType == nil {
		return Parsed{}, &FieldError{Field: "type", Reason: reasonRequired}
	}
	typ, ok := jsonString(rawType)
	if !ok {
		return Parsed{}, &FieldError{Field: "type", Reason: reasonNotString}
	}
	if !ValidType(typ) {
		return Parsed{}, &FieldError{Field: "type", Reason: reasonBadType}
	}

	if rawID != nil {
		id, ok := jsonString(rawID)
		if !ok {
			return Parsed{}, &FieldError{Field: "id", Reason: reasonNotString}
		}
		if !ValidID(id) {
			return Parsed{}, &FieldError{Field: "id", Reason: reasonBadID}
		}
		return Parsed{ID: id, Type: typ, Body: body}, nil
	}

	id := newID()
	if !ValidID(id) {
		// Only valid ids are safe to splice into JSON unquoted.
		return Parsed{}, fmt.Errorf("event: generated id %q is not a valid id", id)
	}
	return Parsed{ID: id, Type: typ, Body: insertID(body, open, id), Generated: true}, nil
}

// insertID returns a copy of body with `"id":"<id>"` as the first member of
// the object opening at body[open], followed by a comma unless the object
// was empty.
func insertID(body []byte, open int, id string) []byte {
	out := make([]byte, 0, len(body)+len(id)+8)
	out = append(out, body[:open+1]...)
	out = append(out, `"id":"`...)
	out = append(out, id...)
	out = append(out, '"')
	if body[skipSpace(body, open+1)] != '}' {
		out = append(out, ',')
	}
	return append(out, body[open+1:]...)
}

// topLevel returns the raw values of the object's "id" and "type" members
// (nil when absent). body must be valid JSON with its object opening at open.
//
// It walks the members itself because encoding/json matches member names
// case-insensitively: it would take {"ID":"a"} or {"Type":"x"} as the event's
// id or type while subscribers' parsers see neither.
func topLevel(body []byte, open int) (rawID, rawType []byte, err error) {
	i := skipSpace(body, open+1)
	if body[i] == '}' {
		return nil, nil, nil
	}
	for {
		keyEnd := skipString(body, i)
		key := body[i:keyEnd]
		i = skipSpace(body, skipSpace(body, keyEnd)+1) // past the colon
		valEnd := skipValue(body, i)
		switch memberName(key) {
		case "id":
			if rawID != nil {
				return nil, nil, &FieldError{Field: "id", Reason: reasonRepeated}
			}
			rawID = body[i:valEnd]
		case "type":
			if rawType != nil {
				return nil, nil, &FieldError{Field: "type", Reason: reasonRepeated}
			}
			rawType = body[i:valEnd]
		}
		i = skipSpace(body, valEnd)
		if body[i] == '}' {
			return rawID, rawType, nil
		}
		i = skipSpace(body, i+1) // past the comma
	}
}

// memberName returns "id" or "type" when the quoted member name key decodes
// to one of them, and "" otherwise, without allocating for plain names.
func memberName(key []byte) string {
	inner := key[1 : len(key)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		switch string(inner) {
		case "id":
			return "id"
		case "type":
			return "type"
		}
		return ""
	}
	name, _ := jsonString(key)
	return name
}

// jsonString decodes raw as a JSON string; ok is false for any other value.
func jsonString(raw []byte) (s string, ok bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), true
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // number, true, false, null
		for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
			i++
		}
		return i
	}
}

// MatchType reports whether typ is selected by a subscriber's patterns:
// "*" selects every type, "video.*" every type starting with "video.", and
// any other pattern only the type equal to it.
func MatchType(patterns []string, typ string) bool {
	for _, p := range patterns {
		if p == "*" || p == typ {
			return true
		}
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasSuffix(prefix, ".") && strings.HasPrefix(typ, prefix) {
			return true
		}
	}
	return false
}

// ValidPattern reports whether p can be stored as a subscriber's pattern:
// "*", a valid type, or a valid type followed by ".*".
func ValidPattern(p string) bool {
	if p == "*" || ValidType(p) {
		return true
	}
	prefix, ok := strings.CutSuffix(p, ".*")
	return ok && ValidType(prefix)
}
