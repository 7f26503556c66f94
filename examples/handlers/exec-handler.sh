#!/bin/sh
# An exec handler for qc-worker: the message body arrives on stdin, metadata in QC_* variables.
# Exit 0: done (the worker deletes the message). Exit 65 (EX_DATAERR): poison. Anything else: retry later.
body=$(cat)
case "$body" in
  *'"poison"'*)
    echo "message $QC_MESSAGE_ID is malformed, giving up" >&2
    exit 65 ;;
  *'"slow"'*)
    # longer than the queue's visibility timeout: the worker's heartbeat keeps the lease alive
    sleep 8 ;;
esac
echo "handled $QC_MESSAGE_ID (receive $QC_RECEIVE_COUNT)" >&2
exit 0
