package keys_test

import (
	"errors"
	"fmt"

	"github.com/dedupkit/dedupkit/keys"
)

func ExampleHeader() {
	s := keys.Header("Nats-Msg-Id")
	fmt.Printf("%q\n", s.Key(keys.Raw{Headers: map[string]string{"Nats-Msg-Id": "order-42"}}))
	fmt.Printf("%q\n", s.Key(keys.Raw{}))
	fmt.Println(keys.Header("").(keys.Validator).Validate())
	// Output:
	// "order-42"
	// ""
	// keys: invalid: Header: empty header name
}

func ExampleComposite() {
	s := keys.Composite(keys.Header("Tenant"), keys.Header("Order"))
	m1 := keys.Raw{Headers: map[string]string{"Tenant": "a|b", "Order": "c"}}
	m2 := keys.Raw{Headers: map[string]string{"Tenant": "a", "Order": "b|c"}}
	fmt.Println(s.Key(m1))
	fmt.Println(s.Key(m2))
	fmt.Printf("%q\n", s.Key(keys.Raw{Headers: map[string]string{"Tenant": "a"}}))
	// Output:
	// 3:a|b1:c
	// 1:a3:b|c
	// ""
}

func ExampleFirstOf() {
	s := keys.FirstOf(keys.Header("Idempotency-Key"), keys.Header("Nats-Msg-Id"), keys.Payload())
	fmt.Println(s.Key(keys.Raw{Headers: map[string]string{"Idempotency-Key": "idem-1", "Nats-Msg-Id": "msg-1"}}))
	fmt.Println(s.Key(keys.Raw{Headers: map[string]string{"Nats-Msg-Id": "msg-1"}}))
	fmt.Println(s.Key(keys.Raw{Body: []byte("hello")}))
	// Output:
	// idem-1
	// msg-1
	// 2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824
}

func ExampleCustom() {
	s := keys.Custom(func(m keys.Message) string { return "tenant-" + m.Header("Tenant") })
	fmt.Println(s.Key(keys.Raw{Headers: map[string]string{"Tenant": "7"}}))
	// Output:
	// tenant-7
}

func ExampleNormalize() {
	fmt.Println(keys.Normalize("order-42"))
	fmt.Println(keys.Normalize("order 42"))
	fmt.Println(keys.Normalize(""))
	// Output:
	// order-42
	// ~59096d5ad4f7817da522986575e827c4ce75eee92fd1a6a5668fcb6a763a9604
	// ~e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
}

func ExampleRecordKey() {
	fmt.Println(keys.RecordKey("{dedup}", "orders", "msg-1"))
	// Output:
	// {dedup}:orders:msg-1
}

func ExampleValidateName() {
	fmt.Println(keys.ValidateName("orders.v2"))
	err := keys.ValidateName("orders:v2")
	fmt.Println(err)
	fmt.Println(errors.Is(err, keys.ErrInvalid))
	// Output:
	// <nil>
	// keys: invalid: handler name "orders:v2": byte ":" at offset 6 is not in [A-Za-z0-9._-]
	// true
}
