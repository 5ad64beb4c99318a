package main

import "github.com/dedupkit/dedupkit/keys"

// orderMsg is the message view Handle reads: the order id travels as the
// Idempotency-Key header, which dedup.DefaultKeyStrategy reads.
func orderMsg(id string) keys.Message {
	return keys.Raw{Headers: map[string]string{"Idempotency-Key": id}}
}
