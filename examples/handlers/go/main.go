// An HTTP handler for qc-worker in Go, standard library only (docs/handler-contract.md).
//
// Single mode (POST /messages): qc-worker POSTs each SQS message in CloudEvents binary mode: the body
// is the message body byte for byte, the metadata is in ce-* and x-sqs-* headers (percent-encoded).
// The answer decides the message's fate:
//
//	2xx                done: the worker deletes the message
//	400 or 422         poison: it can never succeed (the worker applies onPoison)
//	429 + Retry-After  try again later (this message), after that many seconds
//	503 + Retry-After  my dependency is down: the worker pauses receiving for that long
//	anything else      try again later, with the worker's backoff
//
// Batch mode (POST /batch, with handler.batch / --batch-max-items): one POST per batch, a JSON array
// of structured CloudEvents (content-type application/cloudevents-batch+json); the body of each
// message is the event's "data" (a JSON body embedded as JSON, other text as a string, a body that is
// not UTF-8 as "data_base64"). The answer is a 200 with Lambda's ReportBatchItemFailures shape:
//
//	{"batchItemFailures": [{"itemIdentifier": "<message id>"}]}
//
// Listed items are retried (and reach the DLQ by the redrive policy's maxReceiveCount if they keep
// failing), the others deleted. There is no per-item poison: a non-2xx answer applies to every item,
// and 400/422 retries them all.
//
// This one handles order events such as {"orderId": "o-1", "amount": 12}. A body that is not JSON or
// has no orderId is poison (single: 422; batch: listed as failed). {"flaky": true} fails its first
// delivery (single: 429 with Retry-After: 1; batch: listed as failed). Each decision is printed as
// one JSON line on stdout.
//
// Build and run: go build -o qc-handler . && ./qc-handler --port 8080
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"
)

var outputLock sync.Mutex

// record prints one decision as a JSON line; one write per line under a lock, since net/http runs a
// goroutine per connection.
func record(fields map[string]any) {
	fields["handler"] = "go"
	line, err := json.Marshal(fields)
	if err != nil {
		return
	}
	outputLock.Lock()
	defer outputLock.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

// orderID is the order's id, or "" when the body is no order (poison).
func orderID(order map[string]any) string {
	id, _ := order["orderId"].(string)
	return id
}

// unescape decodes a ce-* header value (percent-encoded by the CloudEvents HTTP binding).
func unescape(v string) string {
	if s, err := url.PathUnescape(v); err == nil {
		return s
	}
	return v
}

func single(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The connection failed mid-body: the worker counts that as a transient failure anyway.
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	receiveCount, err := strconv.Atoi(r.Header.Get("ce-sqsreceivecount"))
	if err != nil {
		receiveCount = 1
	}
	rec := func(result string, order string) {
		fields := map[string]any{
			"mode":         "single",
			"id":           unescape(r.Header.Get("ce-id")),
			"receiveCount": receiveCount,
			"source":       unescape(r.Header.Get("ce-source")),
			"type":         r.Header.Get("ce-type"),
			"contentType":  r.Header.Get("Content-Type"),
			"result":       result,
			"orderId":      nil,
		}
		if order != "" {
			fields["orderId"] = order
		}
		record(fields)
	}
	var order map[string]any
	if json.Unmarshal(body, &order) != nil || orderID(order) == "" {
		rec("poison", "")
		// 422: retrying cannot fix this body; the worker applies onPoison.
		w.WriteHeader(http.StatusUnprocessableEntity)
		return
	}
	if flaky, _ := order["flaky"].(bool); flaky && receiveCount == 1 {
		rec("retry", orderID(order))
		// Visible again after 1 s instead of the worker's backoff. (A 503 with Retry-After would say the
		// whole dependency is down: the worker would pause receiving instead.)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	// Real work goes here. It must be idempotent: SQS delivers at least once.
	rec("done", orderID(order))
	w.WriteHeader(http.StatusNoContent)
}

// event is the part of a structured CloudEvent this handler reads.
type event struct {
	ID           string          `json:"id"`
	Source       string          `json:"source"`
	Type         string          `json:"type"`
	ContentType  string          `json:"datacontenttype"`
	Data         json.RawMessage `json:"data"`
	DataBase64   string          `json:"data_base64"`
	ReceiveCount int             `json:"sqsreceivecount"`
}

type itemFailure struct {
	ItemIdentifier string `json:"itemIdentifier"`
}

type batchAnswer struct {
	BatchItemFailures []itemFailure `json:"batchItemFailures"`
}

// handleItem says whether one item of a batch is done (false: retry it).
func handleItem(e event) bool {
	rec := func(result string, order string) {
		fields := map[string]any{
			"mode":         "batch",
			"id":           e.ID,
			"receiveCount": e.ReceiveCount,
			"source":       e.Source,
			"type":         e.Type,
			"contentType":  e.ContentType,
			"result":       result,
			"orderId":      nil,
		}
		if order != "" {
			fields["orderId"] = order
		}
		record(fields)
	}
	// A JSON body arrives as JSON; text as a JSON string, which is no order.
	var order map[string]any
	if len(e.Data) == 0 || json.Unmarshal(e.Data, &order) != nil || orderID(order) == "" {
		// Batch mode has no per-item poison: listed every time, the redrive policy moves it to the DLQ.
		rec("poison", "")
		return false
	}
	if flaky, _ := order["flaky"].(bool); flaky && e.ReceiveCount == 1 {
		rec("retry", orderID(order))
		return false
	}
	// Real work goes here. It must be idempotent: SQS delivers at least once.
	rec("done", orderID(order))
	return true
}

func batch(w http.ResponseWriter, r *http.Request) {
	var events []event
	if err := json.NewDecoder(r.Body).Decode(&events); err != nil {
		// Not a batch at all: a 400 retries every item (never dead-letters them).
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	answer := batchAnswer{BatchItemFailures: []itemFailure{}}
	for _, e := range events {
		if !handleItem(e) {
			answer.BatchItemFailures = append(answer.BatchItemFailures, itemFailure{ItemIdentifier: e.ID})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	// Written whole: an answer cut short is malformed, and the worker retries every item.
	if err := json.NewEncoder(w).Encode(answer); err != nil {
		log.Printf("writing the batch answer: %v", err)
	}
}

func main() {
	port := flag.Int("port", 8080, "port to listen on (the QueueConsumer's handler.http.port)")
	host := flag.String("host", "127.0.0.1", "address to listen on")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /messages", single)
	mux.HandleFunc("POST /batch", batch)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	addr := fmt.Sprintf("%s:%d", *host, *port)
	server := &http.Server{
		Addr:    addr,
		Handler: mux,
		// Above the worker's 4 s idle close, so the worker, not the handler, ends idle connections.
		IdleTimeout:       5 * time.Second,
		ReadHeaderTimeout: 10 * time.Second,
	}
	fmt.Printf("{\"listening\": \"http://%s/messages\", \"batch\": \"http://%s/batch\"}\n", addr, addr)
	log.Fatal(server.ListenAndServe())
}
