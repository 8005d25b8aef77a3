#!/bin/sh
# GET lists the rows; POST appends its body as one row. Both need
# ?password=<DB_PASSWORD>.
case "${QUERY_STRING:-}" in
  *"password=$DB_PASSWORD"*) ;;
  *)
    printf 'Status: 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nwrong password\n'
    exit 0
    ;;
esac
if [ "${REQUEST_METHOD:-GET}" = POST ]; then
  row="$(head -c "${CONTENT_LENGTH:-0}" | tr -d '\r\n')"
  printf '%s\n' "$row" >>/data/rows
fi
printf 'Content-Type: text/plain\r\n\r\n'
cat /data/rows
