package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
)

// exactKeys checks what encoding/json lets through: it matches a key to a
// field ignoring case and lets a repeated key's last value win, so
// {"events":[a],"Events":[b]} would quietly drop a, and {"id":"a","id":"b"}
// would create b. Every object that fills a struct must spell each field as
// its tag does, once. Objects decoded into anything else (an event's own
// payload) are the sender's business and are left alone. body must be
// valid JSON.
func exactKeys(body []byte, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	body = bytes.TrimSpace(body)
	switch {
	case t.Kind() == reflect.Struct && len(body) > 0 && body[0] == '{':
		fields := jsonFields(t)
		var obj []keyValue
		if err := splitObject(body, &obj); err != nil {
			return err
		}
		seen := make(map[string]bool, len(obj))
		for _, kv := range obj {
			if seen[kv.key] {
				return badRequest("invalid JSON: %s must appear only once", quoteKey(kv.key))
			}
			seen[kv.key] = true
			ft, ok := fields[kv.key]
			if !ok {
				return badRequest("invalid JSON: unknown field %s", quoteKey(kv.key))
			}
			if err := exactKeys(kv.value, ft); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Slice && t != rawMessage && len(body) > 0 && body[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(body, &items); err != nil {
			return malformed(body)
		}
		for _, it := range items {
			if err := exactKeys(it, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

var rawMessage = reflect.TypeFor[json.RawMessage]()

type keyValue struct {
	key   string
	value json.RawMessage
}

// splitObject lists an object's members in order, repeats included.
func splitObject(body []byte, out *[]keyValue) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // {
		return malformed(body)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return malformed(body)
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return malformed(body)
		}
		*out = append(*out, keyValue{key, v})
	}
	return nil
}

// jsonFields maps each field's JSON name, as its tag spells it, to its type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case name != "":
			fields[name] = f.Type
		default:
			fields[f.Name] = f.Type
		}
	}
	return fields
}

// quoteKey names a key in an error, cut short so a client's megabyte of
// key is not sent back to it.
func quoteKey(k string) string {
	b, _ := json.Marshal(clip(k))
	return string(b)
}
